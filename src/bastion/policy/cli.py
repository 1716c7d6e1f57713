"""``bastion policy check | explain | test``: validate, explain and test policies from the command line.

The gateway's CLI mounts these under ``bastion policy`` via ``register``; ``python -m bastion.policy.cli`` runs
them standalone. Exit codes: 0 ok/allowed, 1 invalid/denied/failing cases, 2 usage or load error.

What the commands print quotes policy files (rule ids, messages, labels), the command line (tool names,
principals, arguments) and case files: each value is escaped (``bastion.terminal.printable``) and so stays on
its line, and ``main`` (as the ``bastion`` command) escapes stdout and stderr as a whole.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bastion.auth.config import AuthConfig
from bastion.auth.known import PrincipalDirectory, ResolvedPrincipal
from bastion.catalogue import Naming
from bastion.errors import ConfigError
from bastion.policy.cases import check_case, load_cases, tool_entry
from bastion.policy.decide import PolicySet
from bastion.policy.explain import decision_json
from bastion.policy.flow import FlowHistory, Touch
from bastion.policy.load import load_policies, policy_problems
from bastion.policy.model import Decision
from bastion.principal import Principal
from bastion.terminal import json_text, printable, stdio
from bastion.tool_entry import ToolEntry
from bastion.uris import try_canonical

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ERROR = 2
DEFAULT_POLICIES = Path("policies")


# Reads a gateway config file: its ``auth`` section (None without one), its policy paths and its upstreams'
# naming. Given by the ``bastion`` command, which owns loading configs; this module only decides policies.
GatewayConfig = Callable[[str], tuple[AuthConfig | None, list[Path], Naming]]


def register(subparsers: Any, gateway_config: GatewayConfig | None = None) -> None:
    """Add ``check``, ``explain`` and ``test`` to ``subparsers`` (an argparse sub-parsers action); each sets
    ``func(args) -> int``. ``gateway_config`` lets ``explain --config`` read a gateway's config."""
    check = subparsers.add_parser("check", help="validate policy files; lists every problem of every file")
    check.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                       help=f"policy files or directories (default: {DEFAULT_POLICIES})")
    check.set_defaults(func=run_check)

    explain = subparsers.add_parser("explain", help="show the decision for one principal and one tool")
    explain.add_argument("--policies", action="append", type=Path, metavar="PATH",
                         help=f"policy file or directory, repeatable (default: {DEFAULT_POLICIES})")
    explain.add_argument("--config", "-c", metavar="FILE",
                         help="the gateway's config: the principal is resolved as the gateway authenticates it (an "
                              "API key id gets its entry's groups and attributes; --group/--claim then apply to "
                              "JWT subjects only), and --policies defaults to the config's")
    explain.add_argument("--principal", required=True, metavar="ID", help="principal id")
    explain.add_argument("--group", action="append", default=[], metavar="G", help="a group, repeatable")
    explain.add_argument("--claim", action="append", default=[], metavar="K=V",
                         help="a claim/attribute, repeatable; V is JSON if it parses, else a string")
    target = explain.add_mutually_exclusive_group(required=True)
    target.add_argument("--tool", metavar="NAME", help="public tool name, e.g. files__read_file")
    target.add_argument("--prompt", metavar="NAME", help="public prompt name")
    target.add_argument("--resource", metavar="URI", help="resource URI")
    explain.add_argument("--upstream", metavar="U",
                         help="the target's upstream (default: with --config, the upstream whose prefix the name "
                              "or URI carries, as the gateway routes it; without, the NAME's prefix)")
    explain.add_argument("--annotations", metavar="JSON", help="the tool's annotations as the upstream sends them")
    explain.add_argument("--args", metavar="JSON", help="call arguments (default: {})")
    explain.add_argument("--touched", action="append", default=[], metavar="LABEL",
                         help="a label the caller's context already touched (flow conditions), repeatable")
    explain.add_argument("--list", action="store_true",
                         help="decide visibility in tools/list instead of a call (ignores --args)")
    explain.add_argument("--json", action="store_true", help="print the decision as JSON")
    explain.set_defaults(func=run_explain, gateway_config=gateway_config)

    test = subparsers.add_parser("test", help="run a YAML table of cases against policies")
    test.add_argument("file", type=Path, metavar="FILE")
    test.set_defaults(func=run_test)


def run_check(args: argparse.Namespace) -> int:
    paths = args.paths or [DEFAULT_POLICIES]
    problems = policy_problems(paths)
    for problem in problems:
        print(f"error: {printable(str(problem))}", file=sys.stderr)
    if problems:
        return EXIT_FAILED
    try:
        policy = load_policies(paths)
    except ConfigError as exc:  # policy_problems found nothing, so this is not expected; still never a traceback
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    print(f"ok: {len(policy.files)} file(s), {len(policy.rules)} rule(s), version {printable(str(policy.version))}")
    return EXIT_OK


def run_explain(args: argparse.Namespace) -> int:
    try:
        resolved, policy_paths, naming = _principal_and_policies(args)
        policy = load_policies(policy_paths)
        principal = resolved.principal
        upstream = _target_upstream(args, naming)
        decision = _explain(policy, principal, args, upstream)
        labels = sorted(policy.labels_of(_explained_tool(args, upstream))) if args.tool else []
    except ConfigError as exc:
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    # A resource is decided, and forwarded upstream, in its canonical form (``bastion.uris``): show which.
    canonical = try_canonical(args.resource) if args.resource else None
    if args.json:
        out = decision_json(decision, policy, labels)
        if args.resource:
            out["resource"] = canonical
        out["principal"] = {"id": principal.id, "groups": sorted(principal.groups), "source": resolved.source,
                            "detail": resolved.detail, "ignored": list(resolved.ignored)}
        out["upstream"] = upstream
        print(json_text(out, indent=2))
    else:
        groups = ", ".join(printable(g) for g in sorted(principal.groups)) or "none"
        attributes = ", ".join(printable(str(a)) for a in sorted(principal.attributes)) or "none"
        print(f"principal:     {printable(principal.id)} (groups: {groups}; attributes: {attributes})")
        print(f"from:          {printable(resolved.detail)}")
        if resolved.ignored:
            print(f"not applied:   {printable(', '.join(resolved.ignored))} as given: the gateway takes them from "
                  "the source above")
        if args.resource:
            print(f"resource: {printable(canonical) if canonical is not None else '(refused: no canonical form)'}")
        _field("upstream", upstream or "(none)")
        _print_decision(decision, policy, labels)
    return EXIT_OK if decision.allowed else EXIT_FAILED


def run_test(args: argparse.Namespace) -> int:
    try:
        case_file = load_cases(args.file)
        policy = load_policies(case_file.policies)
    except ConfigError as exc:
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    failed = 0
    for case in case_file.cases:
        problems = check_case(policy, case)
        if problems:
            failed += 1
            print(f"FAIL {printable(str(case.name))}")
            for problem in problems:
                print(f"     {printable(str(problem))}")
    passed = len(case_file.cases) - failed
    print(f"{passed} passed, {failed} failed (policy version {printable(str(policy.version))})")
    return EXIT_FAILED if failed else EXIT_OK


def _principal_and_policies(args: argparse.Namespace) -> tuple[ResolvedPrincipal, list[Path], Naming]:
    """The principal to explain, the policy files and the upstreams' naming. With ``--config``, as the gateway
    would see them (the same ``PrincipalDirectory.resolve`` as the admin console, the configured prefixes);
    without, as given on the command line."""
    claims = _claims(args.claim)
    if args.config is None:
        principal = Principal(id=args.principal, groups=frozenset(args.group), attributes=MappingProxyType(claims))
        return ResolvedPrincipal(principal, "entered", "as given (--group, --claim); --config resolves it as the "
                                                       "gateway authenticates it"), \
            list(args.policies or [DEFAULT_POLICIES]), Naming()
    load: GatewayConfig | None = getattr(args, "gateway_config", None)
    if load is None:
        raise ConfigError("--config is not available here")
    auth, configured, naming = load(args.config)
    directory = PrincipalDirectory.from_auth(auth)
    try:
        resolved = directory.resolve(args.principal, groups=args.group, claims=claims)
    except ValueError as exc:
        raise ConfigError(f"--claim: {exc}") from None
    paths = list(args.policies or configured)
    if not paths:
        raise ConfigError(f"{args.config}: no 'policies' configured: every authenticated principal may call every "
                          "tool (or name policy files with --policies)")
    return resolved, paths, naming


def _target_upstream(args: argparse.Namespace, naming: Naming) -> str:
    """The upstream the gateway would route the target to: ``--upstream``, else by the naming (the configured
    prefixes with ``--config``): a rule's ``upstreams`` must meet what the gateway meets, not a guess."""
    if args.upstream:
        return str(args.upstream)
    if args.resource:
        what, found = f"resource {args.resource!r}", naming.upstreams_of_uri(try_canonical(args.resource)
                                                                              or args.resource)
    else:
        name = args.tool or args.prompt
        what, found = f"{'tool' if args.tool else 'prompt'} {name!r}", naming.upstreams_of_name(name)
    if len(found) == 1:
        return found[0]
    if naming.prefixes is None:
        return ""  # no config: nothing better to go on than the name, which carries no prefix
    if not found:
        raise ConfigError(f"no upstream of the config publishes {what} (prefixes: "
                          f"{', '.join(sorted(naming.prefixes)) or 'none'}); name one with --upstream")
    raise ConfigError(f"{what} could be of upstream {' or '.join(sorted(found))}: the config alone cannot tell "
                      "(the live catalogue can: the console's explain form); name one with --upstream")


def _explain(policy: PolicySet, principal: Principal, args: argparse.Namespace, upstream: str) -> Decision:
    if args.prompt:
        return policy.decide_prompt(principal, upstream, args.prompt)
    if args.resource:
        return policy.decide_resource(principal, upstream, args.resource)
    arguments = None if args.list else _json_arg(args.args, "--args", {})
    if not (arguments is None or isinstance(arguments, dict)):
        raise ConfigError("--args must be a JSON object")
    # --touched: the labels the caller's context already touched (one earlier call each, just now).
    history = FlowHistory(tuple(Touch(label, "(--touched)", 0.0, f"touched[{i}]")
                                for i, label in enumerate(args.touched)), 0.0)
    return policy.decide(principal, _explained_tool(args, upstream), arguments, history)


def _explained_tool(args: argparse.Namespace, upstream: str) -> ToolEntry:
    annotations = _json_arg(args.annotations, "--annotations", {})
    if not isinstance(annotations, dict):
        raise ConfigError("--annotations must be a JSON object")
    return tool_entry(args.tool, upstream, annotations)


def _claims(pairs: list[str]) -> dict[str, Any]:
    claims: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--claim {pair!r}: expected KEY=VALUE")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if key in claims:  # a repeated claim is a list claim, like a token's "roles": [...]
            previous = claims[key]
            claims[key] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            claims[key] = value
    return claims


def _json_arg(raw: str | None, flag: str, default: Any) -> Any:
    if raw is None:
        return default
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{flag} is not valid JSON: {exc}") from None


def _print_decision(decision: Decision, policy: PolicySet, labels: list[str] | None = None) -> None:
    data = decision_json(decision, policy, labels)
    _field("decision", data["decision"])
    _field("rule", data["rule"] or "(none: default deny)")
    _field("reason", data["reason"])
    if not decision.allowed:
        _field("caller sees", "rule and description (reveal: true)" if decision.reveal
              else "Unknown tool (reveal: false)")
        if decision.description:
            _field("description", decision.description)
    if decision.approval is not None:
        spec = decision.approval
        _field("approval", f"by {' or '.join(spec.via)}, waits {spec.timeout_s:g} s, remember {spec.remember}")
        if spec.message:
            _field("message", spec.message)
    _field("shadow denies", ", ".join(data["shadow_denies"]) or "none")
    for spec in data["limits"]:
        _field("limit", f"{spec['name']} {spec['rate']} burst {spec['burst']} per {spec['per']}")
    for spec in data["concurrency"]:
        _field("concurrency", f"{spec['name']} max {spec['max']} per {spec['per']}")
    _field("cost", data["cost"])
    _field("labels", ", ".join(data["labels"]) or "none")
    _field("policy", f"version {data['policy_version']} ({len(policy.files)} file(s))")


def _field(label: str, value: Any) -> None:
    """One ``label: value`` line, the value escaped (``bastion.terminal.printable``) so it stays on it."""
    print(f"{label + ':':<15}{printable(str(value))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bastion policy", description="Check, explain and test access policies.")
    with stdio():
        register(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(argv)
        result: int = args.func(args)
        return result


if __name__ == "__main__":
    sys.exit(main())
