"""The result-shape guard: a ``tools/call`` result that is not a well-formed ``CallToolResult`` is not relayed.

A client (or the SDK under it) that receives ``isError: "false"``, ``content`` that is an object, a block of a type
it does not know or ``structuredContent`` that is a list either crashes, or worse, acts on a guess. So the upstream's
answer is checked first, before the output schema and the sanitizer read it, and replaced by a well-formed
``isError: true`` result that says what was wrong (audit outcome ``malformed_result``).

It also bounds the number of content blocks (``sanitize.max_content_blocks``): the excess is cut and replaced by
one marker block, so neither the checks after it nor the client pay for 200,000 tiny blocks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

import structlog

from bastion.call import CallContext, CallRecord
from bastion.errors import ToolError
from bastion.outcome import Outcome
from bastion.sanitize.config import SanitizeConfig

log = structlog.get_logger("bastion.sanitize")

_SAFE_TYPE = re.compile(r"[a-z][a-z_]{0,31}")
# Required string members of each block type of the MCP schema (2025-06-18 … 2026-07-28).
_BLOCK_FIELDS: Mapping[str, tuple[str, ...]] = {
    "text": ("text",),
    "image": ("data", "mimeType"),
    "audio": ("data", "mimeType"),
    "resource_link": ("uri", "name"),
    "resource": (),
}


class MalformedResult(ToolError):
    """The upstream's result is not a well-formed ``CallToolResult``."""

    outcome: ClassVar[Outcome | None] = "malformed_result"


def omitted_marker(omitted: int, limit: int) -> dict[str, Any]:
    return {"type": "text", "text": f"[bastion: {omitted} content blocks omitted: the result exceeded the limit "
                                    f"of {limit} blocks]"}


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _block_problem(i: int, block: Any) -> str | None:
    if not isinstance(block, dict):
        return f"content[{i}] is {_type_name(block)}, not an object"
    kind = block.get("type")
    fields = _BLOCK_FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        shown = f'"{kind}"' if isinstance(kind, str) and _SAFE_TYPE.fullmatch(kind) else "unrecognised"
        return f"content[{i}] has an unknown type ({shown})"
    for name in fields:
        if not isinstance(block.get(name), str):
            return f"content[{i}] ({kind}) has no string '{name}'"
    if kind == "resource":
        resource = block.get("resource")
        if not isinstance(resource, dict) or not isinstance(resource.get("uri"), str):
            return f"content[{i}] (resource) has no resource object with a string 'uri'"
        if not isinstance(resource.get("text"), str) and not isinstance(resource.get("blob"), str):
            return f"content[{i}] (resource) has neither a string 'text' nor a string 'blob'"
    for name in ("annotations", "_meta"):
        if name in block and not isinstance(block[name], dict):
            return f"content[{i}].{name} is {_type_name(block[name])}, not an object"
    return None


def result_problem(result: Any, *, structured_object: bool = True) -> str | None:
    """What makes ``result`` not a well-formed ``CallToolResult``, or None. Pure.

    ``structured_object``: ``structuredContent`` must be an object (handshake-era clients); the 2026-07-28
    revision allows any JSON value there.
    """
    if not isinstance(result, dict):
        return f"the result is {_type_name(result)}, not an object"
    if "isError" in result and not isinstance(result["isError"], bool):
        return f"'isError' is {_type_name(result['isError'])}, not a boolean"
    if "content" not in result:
        return "'content' is missing"
    content = result["content"]
    if not isinstance(content, list):
        return f"'content' is {_type_name(content)}, not a list"
    if structured_object and "structuredContent" in result and not isinstance(result["structuredContent"], dict):
        return f"'structuredContent' is {_type_name(result['structuredContent'])}, not an object"
    if "_meta" in result and not isinstance(result["_meta"], dict):
        return f"'_meta' is {_type_name(result['_meta'])}, not an object"
    for i, block in enumerate(content):
        problem = _block_problem(i, block)
        if problem is not None:
            return problem
    return None


def cap_blocks(result: dict[str, Any], limit: int) -> tuple[dict[str, Any], int]:
    """``result`` with at most ``limit`` content blocks plus a marker; returns how many were omitted."""
    content = result.get("content")
    if not isinstance(content, list) or len(content) <= limit:
        return result, 0
    omitted = len(content) - limit
    return {**result, "content": [*content[:limit], omitted_marker(omitted, limit)]}, omitted


class ResultShapeGuard:
    """First response guard. Runs whether or not sanitizing is enabled for the tool: shape is protocol."""

    name = "result_shape"

    def __init__(self, config: SanitizeConfig) -> None:
        self._config = config

    async def apply(self, ctx: CallContext, result: dict[str, Any], record: CallRecord) -> dict[str, Any]:
        policy = self._config.for_tool(ctx.tool.upstream, ctx.tool.original_name)
        # Cap first, so the per-block checks below are bounded too.
        result, omitted = cap_blocks(result, policy.max_content_blocks) if isinstance(result, dict) \
            else (result, 0)
        if omitted:
            record.sanitize["content_blocks_omitted"] = record.sanitize.get("content_blocks_omitted", 0) + omitted
            log.warning("sanitize.content_blocks_omitted", request_id=ctx.request_id, tool=ctx.tool.public_name,
                        upstream=ctx.tool.upstream, omitted=omitted, limit=policy.max_content_blocks)
        problem = result_problem(result, structured_object=ctx.era == "legacy")
        if problem is not None:
            log.warning("sanitize.malformed_result", request_id=ctx.request_id, tool=ctx.tool.public_name,
                        upstream=ctx.tool.upstream, problem=problem)
            record.violations.append(problem)
            raise MalformedResult(f"The upstream returned a malformed result: {problem}")
        return result
