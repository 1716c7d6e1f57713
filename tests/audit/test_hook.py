from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bastion.audit.hook import CallAuditor
from bastion.audit.log import AuditLog
from bastion.audit.sinks import FileSink
from bastion.call import CallRecord
from bastion.errors import UpstreamUnavailable
from bastion.metrics import Metrics
from tests.audit.helpers import assert_valid, context

OUTCOMES = [("allowed", CallRecord(stage="complete", upstream_ms=5.0)),
            ("denied", CallRecord(stage="policy", rule_id="r1")),
            ("rate_limited", CallRecord(stage="ratelimit", limit="per-principal")),
            ("invalid_input", CallRecord(stage="input_schema", violations=["/a"])),
            ("upstream_error", CallRecord(stage="forward", upstream_ms=1.0)),
            ("client_disconnected", CallRecord(stage="forward"))]


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, _ = metrics.render()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


async def test_one_record_per_call_under_concurrency(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    metrics = Metrics()
    audit = AuditLog([FileSink(path)])
    auditor = CallAuditor(audit, metrics=metrics, clock=lambda: 1_767_225_600.5)

    async def one(i: int) -> None:
        outcome, template = OUTCOMES[i % len(OUTCOMES)]
        rec = CallRecord(stage=template.stage, rule_id=template.rule_id, limit=template.limit,
                         violations=list(template.violations), upstream_ms=template.upstream_ms)
        ctx = context({"i": i})._replace(request_id=f"q{i}", client_id=i)
        await auditor(ctx, rec, outcome, None, 10.0)

    await asyncio.gather(*(one(i) for i in range(240)))
    await audit.close()
    docs = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert sorted(d["call_id"] for d in docs) == sorted(f"q{i}" for i in range(240))
    for d in docs:
        assert_valid(d)
        i = d["request_id"]  # the client's id, as sent (an integer here)
        assert d["call_id"] == f"q{i}"
        assert d["outcome"] == OUTCOMES[i % len(OUTCOMES)][0]
        assert d["time"] == "2026-01-01T00:00:00.490Z"  # the clock read at the end, minus the call's duration
    samples = _samples(metrics)
    calls = {k: v for k, v in samples.items() if k[0] == "bastion_tool_calls_total"}
    assert sum(calls.values()) == 240
    key = ("bastion_tool_calls_total", (("decision", "deny"), ("stage", "ratelimit"), ("tool", "files__read"),
                                        ("upstream", "files")))
    assert calls[key] == 40
    assert samples[("bastion_ratelimit_rejections_total", (("limit", "per-principal"),))] == 40
    assert samples[("bastion_policy_denials_total", (("rule", "r1"),))] == 40
    assert samples[("bastion_validation_actions_total", (("action", "rejected"), ("direction", "input")))] == 40
    assert samples[("bastion_upstream_latency_seconds_count", (("upstream", "files"),))] == 80
    assert samples[("bastion_call_overhead_seconds_count", ())] == 240


async def test_error_refines_the_outcome(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog([FileSink(path)])
    auditor = CallAuditor(audit)
    await auditor(context(), CallRecord(stage="forward"), "upstream_error", None, 3.0,
                  error=UpstreamUnavailable("files", log_detail="http://10.0.0.5:9000 refused"))
    await audit.close()
    (doc,) = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert_valid(doc)
    assert doc["outcome"] == "upstream_unavailable"
    assert doc["error"] == {"type": "UpstreamUnavailable", "plane": "protocol", "code": -31002,
                            "message": "Upstream 'files' is unavailable"}
    assert "10.0.0.5" not in path.read_text()


async def test_without_sinks_no_record_is_built_and_the_metrics_count_the_same(tmp_path: Path) -> None:
    """``audit.sinks: []``: the record is skipped, not its metrics. Every outcome, sanitizer counts and an error
    that refines the outcome give the same samples as an auditor that writes records."""
    cases = [*OUTCOMES, ("allowed", CallRecord(stage="complete", upstream_ms=2.0, sanitize={"secret:aws": 2}))]
    with_records, without = Metrics(), Metrics()
    written = AuditLog([FileSink(tmp_path / "audit.jsonl")])
    silent = AuditLog([])
    built: list[dict[str, object]] = []
    for log, metrics in ((written, with_records), (silent, without)):
        auditor = CallAuditor(log, metrics=metrics)
        for outcome, template in cases:
            await auditor(context(), dataclasses.replace(template), outcome, None, 7.0)
        await auditor(context(), CallRecord(stage="forward"), "upstream_error", None, 3.0,
                      error=UpstreamUnavailable("files"))
    await written.close()

    def counted(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {k: v for k, v in _samples(metrics).items() if not k[0].endswith(("_created", "_sum"))}

    assert counted(without) == counted(with_records)
    assert counted(without)[("bastion_tool_calls_total", (("decision", "allow"), ("stage", "complete"),
                                                          ("tool", "files__read"), ("upstream", "files")))] == 2

    # A console's live table listening: records are built again, for it.
    silent.listeners.append(built.append)
    await CallAuditor(silent)(context(), CallRecord(stage="complete", upstream_ms=1.0), "allowed", None, 2.0)
    (doc,) = built
    assert_valid(doc)
    assert doc["outcome"] == "allowed"
