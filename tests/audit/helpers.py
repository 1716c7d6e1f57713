"""Shared builders for the audit tests: a real context, and the published JSON Schema."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator

from bastion.call import CallContext
from bastion.principal import Principal
from bastion.tool_entry import ToolEntry

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@cache
def schema_validator() -> Draft202012Validator:
    schema = json.loads(resources.files("bastion.audit").joinpath("schema.json").read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def assert_valid(doc: dict[str, Any]) -> None:
    errors = sorted(schema_validator().iter_errors(json.loads(json.dumps(doc))), key=lambda e: e.path)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]


def context(arguments: dict[str, Any] | None = None, *, traceparent: str | None = TRACEPARENT) -> CallContext:
    tool = ToolEntry(public_name="files__read", upstream="files", original_name="read",
                     definition={"name": "files__read"}, upstream_definition={"name": "read"})
    principal = Principal(id="alice", groups=frozenset({"eng", "admins"}),
                          attributes={"email": "alice@example.com"}, auth_method="jwt")
    return CallContext(request_id="call-1", client_id="req-1", principal=principal, tool=tool,
                       arguments=arguments if arguments is not None else {"path": "/etc/hosts"},
                       era="modern", session_id="sess-1",
                       client_info={"name": "claude", "version": "1.2", "description": "free text"},
                       traceparent=traceparent)
