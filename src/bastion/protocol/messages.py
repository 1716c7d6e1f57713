"""The wire messages bastion reads field by field, as ``TypedDict`` shapes.

Everything here arrives from a client or an upstream, so nothing in it is trusted: every field is optional
(``total=False``) and typed ``object``. Viewing any JSON object through one of these shapes (``cast``) therefore
claims nothing that could be false; what the shape adds is the field names, checked by mypy, and a reader must
still narrow each value (``isinstance``) before using it. Fields bastion only passes through are not listed.
Shapes bastion builds itself stay plain dicts: they are written once, where they are built.
"""

from __future__ import annotations

from typing import TypedDict

__all__ = [
    "CallToolParams",
    "CompleteParams",
    "CompletionRef",
    "DiscoverResult",
    "ErrorObject",
    "GetPromptParams",
    "InitializeParams",
    "InitializeResult",
    "InputRequest",
    "InputRequiredResult",
    "ListenParams",
    "PaginatedParams",
    "ReadResourceParams",
    "RequestParams",
    "RoundParams",
    "SetLevelParams",
    "SubscribeParams",
]


# -- request params (client to server) ----------------------------------------------------------------------------

class RequestParams(TypedDict, total=False):
    # Per-request metadata: progress token, trace context, and in 2026-07-28 the envelope (``protocol.meta``).
    _meta: object


class PaginatedParams(RequestParams, total=False):
    cursor: object


class RoundParams(RequestParams, total=False):
    """A request that may take several rounds (2026-07-28): a retry carries the answers to an
    ``input_required`` result and the state it was given with it."""

    inputResponses: object
    requestState: object


class CallToolParams(RoundParams, total=False):
    name: object
    arguments: object


class GetPromptParams(RoundParams, total=False):
    name: object
    arguments: object


class ReadResourceParams(RoundParams, total=False):
    uri: object


class SubscribeParams(RequestParams, total=False):
    uri: object


class CompletionRef(TypedDict, total=False):
    type: object  # "ref/prompt" or "ref/resource"
    name: object
    uri: object


class CompleteParams(RequestParams, total=False):
    ref: object
    argument: object
    context: object


class SetLevelParams(RequestParams, total=False):
    level: object


class InitializeParams(RequestParams, total=False):
    protocolVersion: object
    capabilities: object
    clientInfo: object


class ListenParams(RequestParams, total=False):
    # toolsListChanged / promptsListChanged / resourcesListChanged flags, and resourceSubscriptions.
    notifications: object


# -- results (server to client) -----------------------------------------------------------------------------------

class InitializeResult(TypedDict, total=False):
    protocolVersion: object
    capabilities: object
    serverInfo: object
    instructions: object


class DiscoverResult(TypedDict, total=False):
    supportedVersions: object
    capabilities: object
    instructions: object
    _meta: object


class InputRequest(TypedDict, total=False):
    """One question of an ``input_required`` result: a server-to-client request (``methods.INPUT_CAPABILITY``)."""

    method: object
    params: object


class InputRequiredResult(TypedDict, total=False):
    resultType: object  # "input_required" (any other value: a complete result)
    inputRequests: object  # key -> InputRequest
    requestState: object


class ErrorObject(TypedDict, total=False):
    code: object
    message: object
    data: object
