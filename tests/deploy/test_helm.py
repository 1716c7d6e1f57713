"""deploy/helm/bastion, checked without a helm binary (none ships in a package registry reachable here).

The chart keeps to a small template convention so it can be checked exactly: ``{{ .Values.a.b }}`` and
``{{ .Values.a.b | quote }}``, ``.Release.Name``/``.Release.Namespace``, ``.Chart.Version``/``.Chart.AppVersion``,
whole-line ``{{- if .Values.flag }}`` / ``{{- if not .Values.flag }}`` / ``{{- end }}``, and, for values that are
maps of many entries (policy files, extra labels), whole-line ``{{- range $k, $v := .Values.map }}`` ...
``{{- end }}`` whose body lines may use ``{{ $k | quote }}`` and ``{{ $v | quote }}`` (repeated per entry in key
order, as Go's ``range`` over a map does; no nesting). ``substitute`` below implements exactly that and
rejects anything else, so a template that strays from the convention fails here rather than being half-checked.
The rendered manifests then go through the same schema and structural checks as deploy/kubernetes.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import k8s
from tests.deploy.support import ROOT

CHART = ROOT / "deploy" / "helm" / "bastion"
_ACTION = re.compile(r"{{-?\s*(.*?)\s*-?}}")
_EXPR = re.compile(r"^(\.(?:Values(?:\.[A-Za-z_][A-Za-z0-9_]*)+|Release\.Name|Release\.Namespace|Chart\.Version"
                   r"|Chart\.AppVersion))(\s*\|\s*quote)?$")
_IF = re.compile(r"^{{-\s*if\s+(not\s+)?(\.Values(?:\.[A-Za-z_][A-Za-z0-9_]*)+)\s*}}$")
_RANGE = re.compile(r"^{{-\s*range\s+\$([a-z][A-Za-z0-9]*)\s*,\s*\$([a-z][A-Za-z0-9]*)\s*:=\s*"
                    r"(\.Values(?:\.[A-Za-z_][A-Za-z0-9_]*)+)\s*}}$")
_VAR = re.compile(r"^\$([a-z][A-Za-z0-9]*)(\s*\|\s*quote)?$")
_END = re.compile(r"^{{-\s*end\s*}}$")


def chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def lookup(path: str, values: dict[str, Any], release: str) -> Any:
    if path == ".Release.Name":
        return release
    if path == ".Release.Namespace":
        return "default"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    if path == ".Chart.Version":
        return chart["version"]
    if path == ".Chart.AppVersion":
        return chart["appVersion"]
    node: Any = values
    for key in path.split(".")[2:]:
        assert isinstance(node, dict) and key in node, f"{path} is not in values.yaml"
        node = node[key]
    return node


def go_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    assert isinstance(value, str | int | float), f"only scalars may be substituted, got {value!r}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def substitute(text: str, values: dict[str, Any], release: str = "gw") -> str:
    out: list[str] = []
    stack: list[bool] = []
    # An open range: (key variable, value variable, the map, its body lines so far).
    ranging: tuple[str, str, dict[str, Any], list[str]] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if m := _RANGE.match(stripped):
            assert ranging is None, "nested {{- range }}"
            target = lookup(m.group(3), values, release)
            assert isinstance(target, dict), f"{m.group(3)} must be a map to range over"
            ranging = (m.group(1), m.group(2), target if all(stack) else {}, [])
            continue
        if ranging is not None:
            if _END.match(stripped):
                key_var, value_var, target, body = ranging
                for key in sorted(target):
                    bound = {key_var: key, value_var: target[key]}
                    out.extend(_expand(row, values, release, bound) for row in body)
                ranging = None
                continue
            assert not _IF.match(stripped) and "{{- if" not in line, f"control inside range: {line}"
            ranging[3].append(line)
            continue
        if m := _IF.match(stripped):
            stack.append(bool(lookup(m.group(2), values, release)) != bool(m.group(1)))
            continue
        if _END.match(stripped):
            assert stack, "unbalanced {{- end }}"
            stack.pop()
            continue
        assert "{{- if" not in line and "{{ if" not in line and "end }}" not in line, f"inline control: {line}"
        if not all(stack):
            continue
        out.append(_expand(line, values, release, {}))
    assert not stack, "unclosed {{- if }}"
    assert ranging is None, "unclosed {{- range }}"
    return "\n".join(out) + "\n"


def _expand(line: str, values: dict[str, Any], release: str, bound: dict[str, Any]) -> str:
    def action(m: re.Match[str]) -> str:
        if (var := _VAR.match(m.group(1))) is not None:
            assert var.group(1) in bound, f"template construct outside the chart's convention: {m.group(0)}"
            value = bound[var.group(1)]
            quote = var.group(2)
        else:
            expr = _EXPR.match(m.group(1))
            assert expr, f"template construct outside the chart's convention: {m.group(0)}"
            value = lookup(expr.group(1), values, release)
            quote = expr.group(2)
        # Go's %q, which sprig's quote uses, matches JSON escaping for the text these values hold.
        return json.dumps(go_string(value), ensure_ascii=False) if quote else go_string(value)

    return _ACTION.sub(action, line)


def render(values: dict[str, Any]) -> list[k8s.Doc]:
    docs: list[k8s.Doc] = []
    for template in sorted((CHART / "templates").glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(substitute(template.read_text(), values)) if d is not None)
    return docs


def ranged_values() -> set[str]:
    """Values the templates ``range`` over: maps whose entries are data (file names, labels), not chart knobs."""
    return {m.removeprefix(".Values.") for template in (CHART / "templates").glob("*.yaml")
            for m in re.findall(r"{{-\s*range\s+\$\w+\s*,\s*\$\w+\s*:=\s*(\.Values[\w.]+)",
                                template.read_text())}


def leaf_paths(node: Any, prefix: str = "", maps: frozenset[str] = frozenset()) -> list[str]:
    if isinstance(node, dict) and prefix not in maps:
        return [p for k, v in node.items() for p in leaf_paths(v, f"{prefix}.{k}" if prefix else k, maps)]
    return [prefix]


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "bastion"
    assert chart["type"] == "application"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{chart["appVersion"]}"' in pyproject
    assert chart_values()["image"]["tag"] == chart["appVersion"]


def test_default_values_render_valid_manifests(tmp_path: Path) -> None:
    docs = render(chart_values())
    # ServiceMonitor and HorizontalPodAutoscaler are opt-in (a CRD the cluster may lack; a scaling choice).
    assert {d["kind"] for d in docs} == {"ConfigMap", "Secret", "Service", "Deployment", "PodDisruptionBudget",
                                        "NetworkPolicy"}
    cfg = k8s.check_all(docs, tmp_path)
    ((_, pod, _),) = k8s.bastion_containers(docs)
    (server,) = pod["initContainers"]
    assert server["args"][server["args"].index("--host") + 1] == "127.0.0.1"
    assert [u.url for u in cfg.upstreams] == [f"http://127.0.0.1:{chart_values()['sidecar']['port']}/mcp"]


def test_optional_parts_can_be_turned_off(tmp_path: Path) -> None:
    values = chart_values()
    values["sidecar"]["enabled"] = False
    values["podDisruptionBudget"]["enabled"] = False
    values["networkPolicy"]["enabled"] = False
    values["redis"]["url"] = "redis://redis.shared.svc:6379/0"
    values["replicaCount"] = 5
    docs = render(values)
    assert {d["kind"] for d in docs} == {"ConfigMap", "Secret", "Service", "Deployment"}
    k8s.check_all(docs, tmp_path)
    ((deployment, pod, _),) = k8s.bastion_containers(docs)
    assert "initContainers" not in pod
    assert deployment["spec"]["replicas"] == 5
    (secret,) = k8s.by_kind(docs, "Secret")
    assert secret["stringData"]["redis-url"] == "redis://redis.shared.svc:6379/0"


def test_multiline_values_survive_quoting() -> None:
    docs = render(chart_values())
    config = next(d for d in docs if d["metadata"]["name"] == "gw-config")
    assert config["data"]["bastion.yaml"] == chart_values()["config"]
    (secret,) = k8s.by_kind(docs, "Secret")
    assert secret["stringData"]["api-keys.yaml"] == chart_values()["apiKeys"]


def test_templates_use_only_known_values() -> None:
    known = set(leaf_paths(chart_values(), maps=frozenset(ranged_values())))
    used = set()
    for template in (CHART / "templates").glob("*.yaml"):
        used |= {m.removeprefix(".Values.") for m in re.findall(r"\.Values(?:\.[A-Za-z_][A-Za-z0-9_]*)+",
                                                               template.read_text())}
    assert used <= known, used - known
    # Every value is used by some template: no dead knobs.
    assert known <= used, known - used


def test_every_value_is_documented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    block_indent: int | None = None  # inside a "key: |" block scalar, whose lines are text, not keys
    for n, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if block_indent is not None and (not line.strip() or indent > block_indent):
            continue
        block_indent = None
        m = re.match(r"^(\s*)([A-Za-z0-9][A-Za-z0-9_.-]*):(.*)$", line)
        if not m or m.group(3).strip() == "":
            continue  # not a key, or a parent mapping whose leaves carry the docs
        if m.group(3).strip() == "|":
            block_indent = indent
        comment_above = n > 0 and lines[n - 1].strip().startswith("#")
        assert comment_above, f"values.yaml line {n + 1}: {m.group(2)} has no comment"
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for path in leaf_paths(chart_values(), maps=frozenset(ranged_values())):
        assert f"`{path}`" in docs, f"docs/deploy.md does not describe the Helm value {path}"


@pytest.mark.parametrize("bad", [
    "{{ toYaml .Values.resources | nindent 4 }}",
    "{{ include \"bastion.name\" . }}",
    "{{ .Values.image.tag | default .Chart.AppVersion }}",
    "{{ range .Values.x }}",
])
def test_the_convention_check_rejects_other_constructs(bad: str) -> None:
    with pytest.raises(AssertionError, match="convention"):
        substitute(f"a: {bad}\n", chart_values())


def test_grace_settings_are_consistent_when_changed(tmp_path: Path) -> None:
    values = copy.deepcopy(chart_values())
    values["grace"] = 60
    with pytest.raises(AssertionError):
        k8s.check_bastion(render(values))
    values["terminationGracePeriodSeconds"] = 70
    k8s.check_bastion(render(values))


def test_hpa_and_service_monitor_render_valid_and_point_at_the_gateway(tmp_path: Path) -> None:
    values = chart_values()
    values["redis"]["url"] = "redis://redis.shared.svc:6379/0"
    values["autoscaling"]["enabled"] = True
    values["serviceMonitor"]["enabled"] = True
    values["serviceMonitor"]["labels"] = {"release": "kube-prometheus-stack", "team": "platform"}
    docs = render(values)
    assert {"HorizontalPodAutoscaler", "ServiceMonitor"} <= {d["kind"] for d in docs}
    k8s.check_all(docs, tmp_path)
    ((deployment, _, _),) = k8s.bastion_containers(docs)
    assert "replicas" not in deployment["spec"]  # the HPA owns the count
    (hpa,) = k8s.by_kind(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] == 2 and hpa["spec"]["maxReplicas"] == 10
    assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 70
    (monitor,) = k8s.by_kind(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["metadata"]["labels"]["team"] == "platform"
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s",
                                             "scrapeTimeout": "10s"}]


def test_checks_catch_a_broken_hpa_or_service_monitor(tmp_path: Path) -> None:
    values = chart_values()
    values["autoscaling"]["enabled"] = True
    values["serviceMonitor"]["enabled"] = True
    docs = render(values)
    hpa = next(d for d in docs if d["kind"] == "HorizontalPodAutoscaler")
    hpa["spec"]["maxReplicas"] = 1
    with pytest.raises(AssertionError):
        k8s.check_scaling_and_monitoring(docs)
    docs = render(values)
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["port"] = "metrics"
    with pytest.raises(AssertionError, match="no Service port"):
        k8s.check_scaling_and_monitoring(docs)
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    assert any("intervall" in e for e in k8s.schema_errors(monitor))
    monitor["spec"]["endpoints"][0].pop("intervall")
    monitor["spec"]["endpoints"][0]["interval"] = "30 seconds"
    assert k8s.schema_errors(monitor)
    docs = render(values)
    next(d for d in docs if d["kind"] == "Deployment")["spec"]["replicas"] = 3
    with pytest.raises(AssertionError, match="HPA owns the count"):
        k8s.check_scaling_and_monitoring(docs)


def test_policies_config_map_holds_many_files(tmp_path: Path) -> None:
    values = chart_values()
    base = values["policyFiles"]["policy.yaml"]
    values["policyFiles"] = {
        "20-readonly.yaml": "version: 1\nrules:\n  - id: readers\n    effect: allow\n    principals:\n"
                            "      groups: [readers]\n    tools: [\"*__read*\"]\n",
        "10-base.yaml": base,
    }
    docs = render(values)
    config = next(d for d in docs if d["metadata"]["name"] == "gw-policies")
    assert config["data"] == values["policyFiles"]
    assert list(config["data"]) == ["10-base.yaml", "20-readonly.yaml"]  # Go's range: key order
    cfg = k8s.check_all(docs, tmp_path)  # mounts both files and loads them as bastion would
    policy_dir = tmp_path / "etc" / "bastion" / "policies"
    assert sorted(p.name for p in policy_dir.iterdir()) == ["10-base.yaml", "20-readonly.yaml"]
    assert cfg.policies


def test_range_and_if_not_follow_go_semantics() -> None:
    template = ("a:\n{{- range $k, $v := .Values.m }}\n  {{ $k | quote }}: {{ $v | quote }}\n{{- end }}\n"
                "{{- if not .Values.flag }}\nb: 1\n{{- end }}\n")
    assert substitute(template, {"m": {"z": "1", "a": 'x "y"'}, "flag": False}) == \
        'a:\n  "a": "x \\"y\\""\n  "z": "1"\nb: 1\n'
    assert substitute(template, {"m": {}, "flag": True}) == "a:\n"
    with pytest.raises(AssertionError, match="convention"):
        substitute("{{- range $k, $v := .Values.m }}\n{{ $other }}\n{{- end }}\n", {"m": {"a": "b"}})
    with pytest.raises(AssertionError, match="unclosed"):
        substitute("{{- range $k, $v := .Values.m }}\nx\n", {"m": {}})
