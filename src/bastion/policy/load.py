"""Policy files in, a compiled ``PolicySet`` out, or a ConfigError that names file, line and key path.

Three passes per file: strict YAML (``yamlfile``), the shipped JSON Schema (shape; unknown keys are errors), then
the rules the schema cannot say (globs, patterns, rates, allow-on-annotations, ids unique across files).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from bastion.errors import ConfigError
from bastion.policy.build import build_costs, build_flow_settings, build_label_rule, build_rule
from bastion.policy.decide import PolicySet
from bastion.policy.flow import FlowSettings, LabelRule
from bastion.policy.model import CostWeight, Rule
from bastion.ratelimit.model import ConcurrencySpec, RateLimitSpec
from bastion.yamlfile import YamlDoc, join_path, load_yaml_text

POLICY_SUFFIXES = (".yaml", ".yml")
_Spec = RateLimitSpec | ConcurrencySpec


@dataclass(frozen=True, slots=True)
class PolicyText:
    """One policy file's name (as shown in errors) and its content."""

    source: str
    text: str


def policy_schema(name: str = "schema.json") -> dict[str, Any]:
    """A JSON Schema shipped in this package: the policy file's by default."""
    raw = resources.files("bastion.policy").joinpath(name).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(raw)
    return schema


def policy_files(paths: Sequence[Path]) -> list[Path]:
    """The files ``paths`` name: a file as given, a directory as its ``*.yaml``/``*.yml`` files, sorted.

    Hidden entries are skipped: Kubernetes ConfigMap volumes keep their real files under ``..data`` and editors
    leave ``.name.yaml.swp`` behind.
    """
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir()
                           if p.suffix in POLICY_SUFFIXES and not p.name.startswith(".") and p.is_file())
            if not found:
                raise ConfigError("no policy files (*.yaml, *.yml) in directory; refusing to run with no policy",
                                  source=str(path))
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError("no such policy file or directory", source=str(path))
    return files


def read_policy_texts(paths: Sequence[Path]) -> list[PolicyText]:
    texts = []
    for file in policy_files(paths):
        try:
            texts.append(PolicyText(str(file), file.read_bytes().decode("utf-8")))
        except OSError as exc:
            raise ConfigError(f"cannot read policy file: {exc.strerror}", source=str(file)) from None
        except UnicodeDecodeError:
            raise ConfigError("policy file is not valid UTF-8", source=str(file)) from None
    return texts


def load_policies(paths: Sequence[Path]) -> PolicySet:
    """Load, validate and compile the policy files under ``paths``. Raises ConfigError on the first problem."""
    return compile_policies(read_policy_texts(paths))


def policy_problems(paths: Sequence[Path]) -> list[ConfigError]:
    """Every problem ``load_policies(paths)`` would stop at, file by file, each with its file, line and key path;
    ``[]`` when it would succeed. For ``bastion check`` and ``bastion policy check``: an admin fixes all at once.

    Each file is checked alone (readable, YAML, schema: every violation; then every rule); the checks across
    files (duplicate ids, limit names, ``reveal``) run once every file is valid on its own."""
    try:
        files = policy_files(paths)
    except ConfigError as exc:
        return [exc]
    validator = jsonschema.Draft202012Validator(policy_schema())
    problems: list[ConfigError] = []
    texts: list[PolicyText] = []
    for file in files:
        try:
            (text,) = read_policy_texts([file])
            doc = load_yaml_text(text.text, text.source)
        except ConfigError as exc:
            problems.append(exc)
            continue
        texts.append(text)
        if not isinstance(doc.data, Mapping):
            problems.append(doc.error("the file must be a mapping with 'version: 1' and 'rules:'", None))
            continue
        errors = list(validator.iter_errors(doc.data))
        if errors:
            problems.extend(sorted((_describe(err, doc) for err in errors), key=lambda e: (e.line or 0, e.path or "")))
            continue
        for i, raw in enumerate(doc.data.get("rules", [])):
            try:
                build_rule(raw, f"rules[{i}]", doc)
            except ConfigError as exc:
                problems.append(_located(exc, doc))
        try:
            build_costs(doc.data.get("costs", []), "costs")
        except ConfigError as exc:
            problems.append(_located(exc, doc))
    if not problems:
        try:
            compile_policies(texts)
        except ConfigError as exc:
            problems.append(exc)
    return problems


def compile_policies(texts: Iterable[PolicyText]) -> PolicySet:
    validator = jsonschema.Draft202012Validator(policy_schema())
    rules: list[Rule] = []
    costs: list[CostWeight] = []
    origins: dict[str, str] = {}
    limits: dict[str, tuple[_Spec, str]] = {}
    texts = list(texts)
    sources = []
    reveal: tuple[bool, str] | None = None
    labels: list[LabelRule] = []
    flow: tuple[FlowSettings, str] | None = None
    for item in texts:
        sources.append(item.source)
        doc = load_yaml_text(item.text, item.source)
        validate_document(doc, validator)
        if "reveal" in doc.data:
            # One answer for the whole set: two files disagreeing would make it depend on load order.
            if reveal is not None and reveal[0] != doc.data["reveal"]:
                raise doc.error(f"reveal is {doc.data['reveal']!r} here but {reveal[0]!r} in {reveal[1]}; set it "
                                "in one file", "reveal")
            reveal = (doc.data["reveal"], f"{doc.source}:{doc.line_of('reveal')}")
        try:
            file_rules = [build_rule(raw, f"rules[{i}]", doc) for i, raw in enumerate(doc.data.get("rules", []))]
            costs.extend(build_costs(doc.data.get("costs", []), "costs"))
            labels.extend(build_label_rule(raw, f"labels[{i}]", doc)
                          for i, raw in enumerate(doc.data.get("labels", [])))
            if "flow" in doc.data:
                if flow is not None:
                    raise doc.error(f"a flow block is already set in {flow[1]}; set it in one file", "flow")
                flow = (build_flow_settings(doc.data["flow"], "flow"), f"{doc.source}:{doc.line_of('flow')}")
        except ConfigError as exc:
            raise _located(exc, doc) from None
        for index, rule in enumerate(file_rules):
            path = f"rules[{index}]"
            if rule.id in origins:
                raise doc.error(f"duplicate rule id {rule.id!r} (first defined at {origins[rule.id]})",
                                f"{path}.id")
            origins[rule.id] = rule.origin
            _check_limit_names(rule, path, doc, limits)
        rules.extend(file_rules)
    return PolicySet(rules=tuple(rules), costs=tuple(costs), version=content_version(texts),
                     files=tuple(sources), reveal=reveal[0] if reveal is not None else False,
                     labels=tuple(labels), flow=flow[0] if flow is not None else FlowSettings())


def content_version(texts: Iterable[PolicyText]) -> str:
    """A short hash of file names and contents: the policy version shown in logs, audit and status. Base names
    only, so the same files give the same version however the path to them was spelled."""
    digest = hashlib.sha256()
    for item in texts:
        digest.update(Path(item.source).name.encode() + b"\0" + item.text.encode() + b"\0")
    return digest.hexdigest()[:16]


def _check_limit_names(rule: Rule, path: str, doc: YamlDoc, seen: dict[str, tuple[_Spec, str]]) -> None:
    # A limit name is the key of one counter; two different definitions under one name would share it.
    groups: tuple[tuple[str, tuple[_Spec, ...]], ...] = (("limits", rule.limits), ("concurrency", rule.concurrency))
    for key, specs in groups:
        for i, spec in enumerate(specs):
            where = f"{path}.{key}[{i}]"
            name = f"{key}:{spec.name}"
            if name in seen and seen[name][0] != spec:
                raise doc.error(f"{key} name {spec.name!r} is already defined differently at {seen[name][1]}; "
                                "a name is one counter, so give different limits different names", f"{where}.name")
            seen.setdefault(name, (spec, f"{doc.source}:{doc.line_of(where)}"))


def validate_document(doc: YamlDoc, validator: jsonschema.Draft202012Validator,
                      shape: str = "a mapping with 'version: 1' and 'rules:'") -> None:
    """Raise the first schema violation (by line) as a ConfigError naming file, line and key path."""
    if not isinstance(doc.data, Mapping):
        raise doc.error(f"the file must be {shape}", None)
    errors = list(validator.iter_errors(doc.data))
    if not errors:
        return
    located = sorted((_describe(err, doc) for err in errors), key=lambda e: (e.line or 0, e.path or ""))
    first = located[0]
    if len(located) > 1:
        first = ConfigError(f"{first.message} (and {len(located) - 1} more problem(s) in this file)",
                            source=first.source, path=first.path, line=first.line)
    raise first


def _describe(err: jsonschema.ValidationError, doc: YamlDoc) -> ConfigError:
    path = ""
    for part in err.absolute_path:
        path = join_path(path, part)
    message = err.message
    if err.validator == "additionalProperties" and isinstance(err.instance, Mapping):
        schema = err.schema if isinstance(err.schema, Mapping) else {}
        allowed = sorted(schema.get("properties", {}))
        unknown = sorted(k for k in err.instance if k not in allowed)
        if unknown:
            path = join_path(path, str(unknown[0]))
            message = f"unknown key {unknown[0]!r}; allowed keys here: {', '.join(allowed)}"
    elif err.validator == "required":
        message = f"missing required key: {err.message.split(' is a required')[0]}"
    elif err.validator == "const" and path == "version":
        message = f"unsupported policy version {err.instance!r}; this bastion reads 'version: 1'"
    elif err.validator == "anyOf":
        message = "a claim value must be a string, number, boolean or null, or a non-empty list of them"
    elif err.validator == "pattern" and path.endswith(".id"):
        message = f"invalid rule id {err.instance!r}: use 1-128 ASCII letters, digits, '_', '.', '-'"
    return doc.error(message, path or None)


def _located(exc: ConfigError, doc: YamlDoc) -> ConfigError:
    if exc.source is not None:
        return exc
    return doc.error(exc.message, exc.path)
