"""Audit: one versioned record per event (``record``), sinks that write them (``sinks``; the file sink's writes go
to its thread in batches, ``batch``), the fan-out with the fail-open/fail-closed contract (``log``) and its config
section (``config``).

Who writes: a tool call's one record comes from the pipeline's hook (``hook.CallAuditor``); every other record
(sessions, policy reloads, auth failures, the catalogue's drops, limits and findings, pin drift) goes through
``events.AuditEvents``; ``view_step.AuditCatalogueDrops`` is the last view step, recording what clients do not
get."""

from bastion.audit.config import AuditConfig, build_audit_log
from bastion.audit.events import AuditEmit, AuditEvents
from bastion.audit.hook import CallAuditor
from bastion.audit.log import AuditLog
from bastion.audit.record import (
    SCHEMA_VERSION,
    arguments_digest,
    as_outcome,
    auth_failure_record,
    call_record,
    classify_outcome,
    pin_approve_record,
    pin_drift_record,
    policy_reload_record,
    session_record,
    tools_list_record,
)
from bastion.audit.sinks import AuditSink, AuditSinkError, FileSink, RedisStreamSink, StdoutSink
from bastion.audit.view_step import AuditCatalogueDrops

__all__ = [
    "SCHEMA_VERSION",
    "AuditCatalogueDrops",
    "AuditConfig",
    "AuditEmit",
    "AuditEvents",
    "AuditLog",
    "AuditSink",
    "AuditSinkError",
    "CallAuditor",
    "FileSink",
    "RedisStreamSink",
    "StdoutSink",
    "arguments_digest",
    "as_outcome",
    "auth_failure_record",
    "build_audit_log",
    "call_record",
    "classify_outcome",
    "pin_approve_record",
    "pin_drift_record",
    "policy_reload_record",
    "session_record",
    "tools_list_record",
]
