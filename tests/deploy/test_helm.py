"""deploy/helm/bastion, checked without a helm binary (none ships in a package registry reachable here).

The chart keeps to a small template convention so it can be checked exactly: ``{{ .Values.a.b }}`` and
``{{ .Values.a.b | quote }}``, ``.Release.Name``/``.Release.Namespace``, ``.Chart.Version``/``.Chart.AppVersion``,
and whole-line ``{{- if .Values.flag }}`` / ``{{- end }}``. ``substitute`` below implements exactly that and
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
_IF = re.compile(r"^{{-\s*if\s+(\.Values(?:\.[A-Za-z_][A-Za-z0-9_]*)+)\s*}}$")
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
    for line in text.splitlines():
        stripped = line.strip()
        if m := _IF.match(stripped):
            stack.append(bool(lookup(m.group(1), values, release)))
            continue
        if _END.match(stripped):
            assert stack, "unbalanced {{- end }}"
            stack.pop()
            continue
        assert "{{- if" not in line and "{{ if" not in line and "end }}" not in line, f"inline control: {line}"
        if not all(stack):
            continue

        def action(m: re.Match[str]) -> str:
            expr = _EXPR.match(m.group(1))
            assert expr, f"template construct outside the chart's convention: {m.group(0)}"
            value = lookup(expr.group(1), values, release)
            # Go's %q, which sprig's quote uses, matches JSON escaping for the text these values hold.
            return json.dumps(go_string(value), ensure_ascii=False) if expr.group(2) else go_string(value)

        out.append(_ACTION.sub(action, line))
    assert not stack, "unclosed {{- if }}"
    return "\n".join(out) + "\n"


def render(values: dict[str, Any]) -> list[k8s.Doc]:
    docs: list[k8s.Doc] = []
    for template in sorted((CHART / "templates").glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(substitute(template.read_text(), values)) if d is not None)
    return docs


def leaf_paths(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in leaf_paths(v, f"{prefix}.{k}" if prefix else k)]
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
    known = set(leaf_paths(chart_values()))
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
        m = re.match(r"^(\s*)([A-Za-z][A-Za-z0-9_]*):(.*)$", line)
        if not m or m.group(3).strip() == "":
            continue  # not a key, or a parent mapping whose leaves carry the docs
        if m.group(3).strip() == "|":
            block_indent = indent
        comment_above = n > 0 and lines[n - 1].strip().startswith("#")
        assert comment_above, f"values.yaml line {n + 1}: {m.group(2)} has no comment"
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for path in leaf_paths(chart_values()):
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
