"""Audit: one versioned record per event (``record``), sinks that write them (``sinks``; the file sink's writes go
to its thread in batches, ``batch``), the fan-out with the fail-open/fail-closed contract (``log``) and its config
section (``config``)."""

from bastion.audit.config import AuditConfig, build_audit_log
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

__all__ = [
    "SCHEMA_VERSION",
    "AuditConfig",
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
