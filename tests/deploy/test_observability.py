"""The shipped operator assets: Prometheus alert rules and the Grafana dashboard.

Both are checked with the real tools where one exists (``promtool`` from Debian's ``prometheus`` package, which
``.ci/test`` installs when it is missing) and against bastion's own metrics registry, so an alert or a panel that
names a series bastion does not export fails here instead of staying silent in production.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bastion.metrics import Metrics
from tests.deploy.support import ROOT

RULES = ROOT / "deploy" / "prometheus" / "bastion-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "bastion-rules.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "bastion-dashboard.json"
_SERIES = re.compile(r"\bbastion_[a-z0-9_]+")


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: install Debian's 'prometheus' package (.ci/test does)"
    return path


def exported_series() -> set[str]:
    """Every sample name bastion can export, with the suffixes Prometheus adds (_total, _bucket, ...)."""
    metrics = Metrics()
    # Touch each labelled family once so that its samples appear in the exposition.
    metrics.observe_call(tool="t", upstream="u", decision="allow", stage="complete", total_s=0.01, upstream_s=0.005)
    metrics.ratelimit_rejected("l")
    metrics.validation_action("input", "rejected")
    metrics.sanitize_counts({"c": 1})
    metrics.declare_upstreams(["u"])
    metrics.policy_reloaded("applied")
    metrics.api_keys_reloaded("applied")
    metrics.audit_sink_failed("stdout")
    metrics.policy_denied("r")
    metrics.set_limiter_redis_up(True)
    metrics.session_fallback("served_local")
    metrics.pin_store_failed("static")
    metrics.catalogue_refreshed("u", "ok")
    metrics.upstream_health("u", "restarting", previous="up")
    metrics.session_opened()
    metrics.session_started()
    body, _ = metrics.render()
    return {s.name for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def rule_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return [(rule["alert"], rule["expr"]) for group in doc["groups"] for rule in group["rules"]]


def dashboard_targets() -> list[tuple[str, str]]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in doc["panels"] for target in panel.get("targets", [])]


def test_rules_pass_promtool_check() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_rules_unit_tests_pass() -> None:
    # promtool resolves rule_files relative to the test file, so it runs from that folder.
    done = subprocess.run([promtool(), "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test() -> None:
    tested = {case["alertname"] for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for case in test.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert {name for name, _ in rule_exprs()} - {"BastionDenySpike"} <= tested
    # BastionDenySpike compares with the same hour a day earlier; a day of input series adds nothing it checks.


@pytest.mark.parametrize(("source", "entries"), [("rules", rule_exprs), ("dashboard", dashboard_targets)])
def test_queries_name_only_series_bastion_exports(source: str, entries: Any) -> None:
    series = exported_series()
    unknown = {(where, name) for where, expr in entries() for name in _SERIES.findall(expr) if name not in series}
    assert not unknown, f"{source} query series bastion does not export: {sorted(unknown)}"


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """Grafana has no offline checker; promtool parses each panel query as a recording rule instead, with the
    dashboard's variables replaced by what Grafana would send."""
    rules = [{"record": f"bastion:dashboard:q{i}",
              "expr": expr.replace("$__rate_interval", "5m").replace("$instance", ".*")}
             for i, (_, expr) in enumerate(dashboard_targets())]
    assert rules
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_is_importable() -> None:
    """What Grafana's importer needs: a uid, unique panel ids, a data-source variable every query uses, and panels
    laid out on the 24-column grid without overlapping."""
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and doc["schemaVersion"] >= 36
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    assert any(v["type"] == "datasource" and v["name"] == "datasource" for v in doc["templating"]["list"])
    cells: set[tuple[int, int]] = set()
    for panel in doc["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))
    titles = " ".join(p["title"].lower() for p in doc["panels"])
    for topic in ("decision", "denials by policy rule", "rate-limit", "overhead", "upstream up", "sessions",
                  "audit sink"):
        assert topic in titles, topic
