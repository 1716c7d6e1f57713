"""What each page shows, as plain data: pure functions of the sources, rendered by the templates."""

from __future__ import annotations

import difflib
import json
import time
from collections.abc import Mapping
from typing import Any

from bastion.admin.sources import AdminSources
from bastion.admin.tap import AuditTap
from bastion.approvals.model import PendingApproval
from bastion.audit.record import logged_arguments, rfc3339
from bastion.pinning.fingerprint import diff as diff_definitions
from bastion.pinning.model import PinnedTool


def overview(src: AdminSources, tap: AuditTap) -> dict[str, Any]:
    view = src.view()
    counts: dict[str, int] = {}
    for entry in view.catalogue.tools:
        counts[entry.upstream] = counts.get(entry.upstream, 0) + 1
    health = src.monitor.snapshot()
    upstreams = []
    for name in src.pool.names:
        info = getattr(src.pool.member(name).upstream, "info", None)
        h = health.get(name, {})
        upstreams.append({
            "name": name, "era": getattr(info, "era", None) or "-",
            "protocol_version": getattr(info, "protocol_version", None) or "-",
            "transport": _transport(src.pool.member(name).upstream), "state": h.get("state", "unknown"),
            "reason": h.get("reason") or "", "since": h.get("since", ""), "connected": src.pool.is_up(name),
            "tools": counts.get(name, 0), "hidden": name in view.unavailable,
            "restarts": src.restarts.get(name, 0)})
    sinks = [{"name": s.name, "failures": src.audit_log.failures(s.name)} for s in src.audit_log.sinks]
    return {"upstreams": upstreams, "catalogue_version": view.catalogue.version or "(none yet)",
            "tools": len(view.catalogue.tools), "quarantined": len(view.quarantined),
            "sessions": src.sessions(), "rates": tap.per_minute(), "sinks": sinks,
            "audit_required": src.audit_log.required, "uptime_s": int(time.time() - src.started_at)}


def _transport(upstream: object) -> str:
    kind = type(upstream).__name__.lower()
    for needle, label in (("stdio", "stdio"), ("sse", "http+sse (legacy)"), ("modern", "streamable http"),
                          ("http", "streamable http")):
        if needle in kind:
            return label
    return kind


def catalogue(src: AdminSources, principal: str | None = None) -> dict[str, Any]:
    """Every tool as clients see it, and every hidden one with the reason. With ``principal`` (one of the known
    principals), also what the policy hides from that principal, by the rule that hides it: the same
    ``PolicySet.decide`` (list form, no arguments) as ``tools/list`` and ``bastion policy explain --list``, for the
    principal as the gateway authenticates it (``PrincipalDirectory``: an API key's groups and attributes)."""
    view = src.view()
    directory = src.directory()
    chosen = directory.find(principal) if principal else None
    policy = src.policy.current if src.policy is not None and chosen is not None else None
    visible, hidden = [], []
    for entry in sorted(view.catalogue.tools, key=lambda e: e.public_name):
        row = {"name": entry.public_name, "upstream": entry.upstream, "original": entry.original_name,
               "description": str(entry.definition.get("description") or ""),
               "annotations": dict(entry.annotations),
               "input_schema": _pretty(entry.definition.get("inputSchema")),
               "output_schema": _pretty(entry.definition.get("outputSchema")), "rule": None}
        reason = view.quarantined.get(entry.public_name)
        if reason is not None:
            hidden.append({**row, "why": "quarantine", "reason": reason})
            continue
        if entry.upstream in view.unavailable:
            hidden.append({**row, "why": "upstream down", "reason": f"{entry.upstream} is down past health.hide_after"})
            continue
        if policy is not None and chosen is not None:
            decision = policy.decide(chosen, entry, None)
            if not decision.allowed:
                hidden.append({**row, "why": "policy", "rule": decision.rule_id,
                               "reason": f"hidden from {chosen.id}: {decision.reason}"})
                continue
            row["rule"] = decision.rule_id
            row["effect"] = "approve" if decision.approval is not None else "allow"
        visible.append(row)
    hidden.extend({"name": drop.name, "upstream": drop.upstream, "original": drop.name, "description": "",
                   "annotations": {}, "input_schema": "", "output_schema": "", "rule": None,
                   "why": _drop_kind(drop.reason), "reason": f"{drop.kind}: {drop.reason}"}
                  for drop in view.catalogue.dropped)
    # Tools policy hides are per principal: without one chosen, say how to see them.
    policy_note = None
    if src.policy is not None and chosen is None:
        policy_note = ("policy decides visibility per principal (default deny): choose a principal to see what it "
                       "hides from whom, or use the policy page's explain form")
    elif src.policy is None and chosen is not None:
        policy_note = "no policy is configured: every authenticated principal sees every listed tool"
    return {"visible": visible, "hidden": hidden, "version": view.catalogue.version or "(none yet)",
            "policy_note": policy_note, "selected": chosen.id if chosen is not None else "",
            "unknown": principal if principal and chosen is None else "",
            "principals": [{"id": p.id, "groups": sorted(p.groups)} for p in directory.known]}


def _drop_kind(reason: str) -> str:
    text = reason.lower()
    if "limit" in text or "max_" in text:
        return "limits"
    if "schema" in text or "invalid" in text or "name" in text:
        return "invalid definition"
    return "dropped"


def _pretty(value: Any) -> str:
    return "" if value is None else json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def pins(items: list[PinnedTool]) -> list[dict[str, Any]]:
    """Pending changes, each with a side-by-side line diff of the two definitions and the field-level summary."""
    out = []
    for item in items:
        pin, cand = item.pin, item.pin.candidate
        if cand is None:
            continue
        old, new = _pretty(dict(pin.definition)).splitlines(), _pretty(dict(cand.definition)).splitlines()
        out.append({"upstream": item.upstream, "tool": pin.tool, "approved": pin.fingerprint,
                    "approved_by": pin.approved_by, "approved_at": pin.approved_at,
                    "pending": cand.fingerprint, "first_seen": cand.first_seen, "rejected_by": cand.rejected_by,
                    "summary": diff_definitions(pin.definition, cand.definition), "rows": side_by_side(old, new)})
    return out


def side_by_side(old: list[str], new: list[str]) -> list[tuple[str, str, str]]:
    """Rows of (kind, left, right): ``same``, ``del``, ``add`` or ``chg``, aligned by difflib's opcodes."""
    rows: list[tuple[str, str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if op == "equal":
            rows.extend(("same", old[i], new[j]) for i, j in zip(range(i1, i2), range(j1, j2), strict=True))
            continue
        left, right = old[i1:i2], new[j1:j2]
        for k in range(max(len(left), len(right))):
            a = left[k] if k < len(left) else ""
            b = right[k] if k < len(right) else ""
            rows.append(("chg" if a and b else "del" if a else "add", a, b))
    return rows


def live_record(record: Mapping[str, Any], *, log_arguments: bool) -> dict[str, Any]:
    """A record as the live table may show it: raw arguments never, unless ``audit.log_arguments`` is on (the
    audit record then carries them already redacted by the audit module)."""
    out = dict(record)
    if not log_arguments:
        out.pop("arguments", None)
    return out


def matches(record: Mapping[str, Any], filters: Mapping[str, str]) -> bool:
    principal = record.get("principal")
    tool = record.get("tool")
    values = {"principal": principal.get("id") if isinstance(principal, Mapping) else None,
              "tool": tool.get("name") if isinstance(tool, Mapping) else tool,
              "decision": record.get("decision"), "rule": record.get("rule_id"), "event": record.get("event")}
    for key, wanted in filters.items():
        if wanted and wanted.lower() not in str(values.get(key) or "").lower():
            return False
    return True


def approvals(items: list[PendingApproval], *, log_arguments: bool, now: float) -> list[dict[str, Any]]:
    """Pending approvals as the page shows them, oldest first. Arguments follow the live table's rule: never
    shown unless ``audit.log_arguments`` is on, and then as an audit record would log them (secret-looking keys
    masked); the pending entry itself only holds a short summary of them, never the raw payload."""
    return [{"id": p.id, "principal": p.principal, "tool": p.tool, "upstream": p.upstream, "rule_id": p.rule_id,
             "message": p.message or "", "via": list(p.via), "admin_may": "admin" in p.via,
             "arguments": logged_arguments(dict(p.arguments)) if log_arguments else None,
             "argument_count": len(p.arguments), "since": rfc3339(p.created_at),
             "waiting_s": max(0, int(now - p.created_at)), "expires": rfc3339(p.expires_at),
             "expires_in_s": max(0, int(p.expires_at - now))}
            for p in sorted(items, key=lambda p: p.created_at)]
