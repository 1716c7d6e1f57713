"""Walk a ``CallToolResult`` (and error messages and notifications) and sanitize every string a model can read.

Pure: takes JSON objects, returns new ones plus a ``SanitizeReport``; the input is never mutated, and containers
that needed no change are returned as the same objects (so a clean result costs no copies).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson

from bastion.sanitize.config import EffectiveSanitizePolicy
from bastion.sanitize.report import SanitizeReport
from bastion.sanitize.strings import (
    MAX_DEPTH,
    SCAN_MARGIN,
    StringSanitizer,
    truncate_utf8,
    truncation_marker,
    window,
)
from bastion.sanitize.walk import DROP, Walker

ERROR_MESSAGE_BYTES = 4096
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
# Schemes a client may execute or that inline arbitrary content; every other scheme (https, file, custom
# resource schemes such as postgres:// or github://) is a name, not an action.
UNSAFE_URI_SCHEMES = frozenset({"javascript", "vbscript", "data", "blob", "livescript", "mocha"})
_BINARY_TYPES = {"image": "data", "audio": "data"}
# Members of each content block handled field by field; every other member is walked as text (walk.Walker).
_TEXT_FIELDS = frozenset({"type", "text"})
_BINARY_FIELDS = frozenset({"type", "data", "mimeType"})
_BLOCK_FIELDS = frozenset({"type", "resource"})
_RESOURCE_FIELDS = frozenset({"uri", "text", "blob", "mimeType"})
_LINK_FIELDS = frozenset({"type", "uri", "name", "title", "description", "mimeType"})
_RESULT_FIELDS = frozenset({"content", "structuredContent", "isError"})


# A backslash escape in JSON text: \uXXXX (group 1: the digits) or any other (kept as it is).
_JSON_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)
# Escapes left as they are: undone, a quote or a backslash would move where a string of the text ends.
_KEPT_ESCAPES = frozenset({0x22, 0x5C})


def json_escapes_undone(text: str) -> str:
    """``text`` with its JSON ``\\uXXXX`` escapes replaced by the characters they stand for (surrogate pairs
    joined, lone surrogates as U+FFFD), but for quotes and backslashes; every other escape stays."""
    if "\\u" not in text:
        return text
    surrogates = False

    def undo(match: re.Match[str]) -> str:
        nonlocal surrogates
        digits = match.group(1)
        if digits is None:
            return match.group(0)
        point = int(digits, 16)
        if point in _KEPT_ESCAPES:
            return match.group(0)
        surrogates = surrogates or 0xD800 <= point <= 0xDFFF
        return chr(point)

    out = _JSON_ESCAPE.sub(undo, text)
    if surrogates:
        out = out.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return out


class _TooDeep(Exception):
    pass


def uri_is_safe(uri: str) -> bool:
    m = _SCHEME.match(uri)
    return m is not None and m.group(1).lower() not in UNSAFE_URI_SCHEMES and uri.isprintable()


def _dumps_like(value: Any, original: str) -> str:
    """Serialise ``value`` in the layout of ``original`` (indented or not), keeping non-ASCII readable."""
    if "\n" in original:
        return json.dumps(value, indent=2, ensure_ascii=False)
    if ": " in original or ", " in original:
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _loads(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        # orjson refuses integers beyond 64 bits and lone surrogates that the stdlib accepts.
        return json.loads(text)


class Sanitizer(StringSanitizer):
    """One walk: the policy, the report it fills, and the byte budget left for content blocks."""

    def __init__(self, policy: EffectiveSanitizePolicy, report: SanitizeReport | None = None) -> None:
        super().__init__(policy, report)
        self.budget = policy.max_result_bytes
        # Fields beyond the ones handled here (annotations, icons, _meta, whatever a new revision adds) are walked
        # as text by default; credential keys are redacted by name in _meta.
        self._walker: Walker | None = None  # made on first use: most results need none
        # Set by ``prescan_whole``: one prescan judged every string this walk hands to ``string()``.
        self._whole = False

    def rest(self, source: Mapping[str, Any], out: dict[str, Any], handled: frozenset[str],
             where: str = "") -> dict[str, Any]:
        """``out`` with every member of ``source`` not in ``handled`` walked by ``walk.Walker``."""
        for key, value in source.items():
            if key in handled:
                continue
            if self._walker is None:
                self._walker = Walker(self)
            new = self._walker.field(key, value, f"{where}{key}")
            if new is DROP:
                out.pop(key, None)
            elif new is not value:
                out[key] = new
        return out

    def prescan_whole(self, result: Mapping[str, Any]) -> None:
        """One prescan over every string of ``result`` (``StringSanitizer.prescan``), lasting the whole walk, when
        it sees what the walk will scan: each string as it stands, which rules out a text block that may be JSON
        (its strings are scanned parsed, with their escapes undone). A small clean result then costs one pass
        per pattern set, not one per string and per tree."""
        content = result.get("content")
        if isinstance(content, list) and not all(_plain_text_block(block) for block in content):
            return
        self._whole = self.prescan(result) is not None

    def json_tree(self, value: Any) -> Any:
        """``json_value`` with one RE2 pass over all strings first, so a clean tree of many small strings does
        not pay two pattern-set scans per string. A match spanning two strings only costs the per-string path.

        When the prescan found that the walk would change nothing (``untouched``), the value comes back without
        it: a clean structured result of a few thousand strings cost more in that walk, which copies every
        container to compare it, than in everything else the sanitizer does to it."""
        if self._whole:
            return value if self._untouched else self.json_value(value)
        self.prescan(value)
        try:
            return value if self._untouched else self.json_value(value)
        finally:
            self._patterns = True
            self._plain = False
            self._untouched = False

    def json_value(self, value: Any, depth: int = 0) -> Any:
        """Every string leaf and key of a JSON value; the same object back when nothing changed."""
        if isinstance(value, str):
            return self.string(value, self.policy.max_item_bytes)
        if depth > MAX_DEPTH:
            raise _TooDeep
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            changed = False
            for key, item in value.items():
                if isinstance(key, str):
                    new_key = self.string(key)
                    # A string member is matched with its key before it (``Redactor.redact``); the key stays.
                    new_item = (self.string(item, self.policy.max_item_bytes, key=key) if isinstance(item, str)
                                else self.json_value(item, depth + 1))
                else:
                    new_key = key
                    new_item = self.json_value(item, depth + 1)
                changed = changed or new_key != key or new_item is not item
                out[new_key] = new_item
            return out if changed else value
        if isinstance(value, list):
            items = [self.json_value(item, depth + 1) for item in value]
            return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
        return value

    def _budgeted(self, text: str, left_out: int = 0) -> str:
        limit = min(self.policy.max_item_bytes, self.budget)
        out = self.string(text, limit, left_out=left_out)
        # Markers do not count against the budget: min() drops them, since only a cut text carries one.
        self.budget = max(0, self.budget - min(limit, len(out.encode("utf-8", "surrogatepass"))))
        return out

    # -- content blocks --------------------------------------------------------------------------------------

    def _note(self, message: str) -> dict[str, Any]:
        return {"type": "text", "text": f"[bastion: {message}]"}

    def _binary_ok(self, kind: str, mime: Any, data: Any) -> dict[str, Any] | None:
        """None when the payload may pass, else the note that replaces the block."""
        if not isinstance(mime, str) or not self.policy.mime_allowed(mime):
            self.report.bump("mime_blocked")
            shown = mime if isinstance(mime, str) and mime.isascii() and mime.isprintable() else "unknown"
            return self._note(f'{kind} content removed: type "{shown[:100]}" is not allowed')
        size = len(data) if isinstance(data, str) else 0
        if size > min(self.policy.max_item_bytes, self.budget):
            self.report.bump("oversized")
            return self._note(f"{kind} content removed: {size} bytes exceed the size limit")
        self.budget -= size
        return None

    def _uri(self, uri: Any) -> str:
        """The URI cleaned, or "" (unsafe) when it is no string or longer than a text may be: a URI cannot be cut,
        and one of megabytes names nothing a client should fetch."""
        if not isinstance(uri, str) or len(uri) > self.policy.max_item_bytes:
            return ""
        return self.string(uri)

    def _resource(self, block: Mapping[str, Any]) -> dict[str, Any]:
        resource = block.get("resource")
        if not isinstance(resource, Mapping):
            self.report.bump("unknown_content")
            return self._note("malformed embedded resource removed")
        clean_uri = self._uri(resource.get("uri"))
        if not uri_is_safe(clean_uri):
            self.report.bump("unsafe_uri")
            return self._note("embedded resource removed: unsafe URI")
        new = dict(resource)
        new["uri"] = clean_uri
        if isinstance(resource.get("text"), str):
            new["text"] = self._budgeted(resource["text"])
        if "blob" in resource:
            note = self._binary_ok("blob", resource.get("mimeType"), resource.get("blob"))
            if note is not None:
                return note
        if isinstance(resource.get("mimeType"), str):
            new["mimeType"] = self.string(resource["mimeType"], 255)
        return self.rest(block, {**block, "resource": self.rest(resource, new, _RESOURCE_FIELDS)}, _BLOCK_FIELDS)

    def _resource_link(self, block: Mapping[str, Any]) -> dict[str, Any]:
        clean_uri = self._uri(block.get("uri"))
        if not uri_is_safe(clean_uri):
            self.report.bump("unsafe_uri")
            return self._note("resource link removed: unsafe URI")
        new = dict(block)
        new["uri"] = clean_uri
        for key in ("name", "title", "description", "mimeType"):
            if isinstance(block.get(key), str):
                new[key] = self.string(block[key], self.policy.max_item_bytes)
        return self.rest(block, new, _LINK_FIELDS)

    def _text_block(self, block: Mapping[str, Any], original_sc: Any, new_sc: Any, has_sc: bool) -> dict[str, Any]:
        text = block.get("text")
        if not isinstance(text, str):
            self.report.bump("unknown_content")
            return self._note("malformed text content removed")
        stripped = text.lstrip()
        if stripped[:1] in ("{", "[") and (len(text) > self.policy.max_item_bytes or len(text) > self.budget):
            # JSON too long to leave whole: the client gets a cut text that no parser reads, so parsing and walking
            # all of it (seconds for tens of megabytes) buys nothing. What can leave is scanned as text, with its
            # \\u escapes undone so that what they hide is cleaned and scanned like the rest (a lenient parser
            # would still decode them); only the undone text leaves, so no escape passes unseen.
            head, left_out = window(text, min(self.policy.max_item_bytes, self.budget) + SCAN_MARGIN)
            return self.rest(block, {**block, "text": self._budgeted(json_escapes_undone(head), left_out)},
                             _TEXT_FIELDS)
        if stripped[:1] in ("{", "["):
            try:
                parsed = _loads(text)
            except ValueError:
                parsed = None
            else:
                if has_sc and parsed == original_sc:
                    # The backward-compatible mirror of structuredContent: it must say what structuredContent says.
                    mirror = text if new_sc is original_sc else _dumps_like(new_sc, text)
                    return self.rest(block, {**block, "text": self._limit_only(mirror)}, _TEXT_FIELDS)
                if isinstance(parsed, dict | list):
                    # JSON text hides characters as \\u escapes that only appear once a client parses it.
                    try:
                        walked = self.json_tree(parsed)
                    except _TooDeep:
                        walked = parsed
                    else:
                        # Strings are scanned one by one; the shape of the whole (a tool call, a JSON-RPC
                        # message) only shows here.
                        self.report.add(self.policy.detector.scan_json(parsed))
                        new = text if walked is parsed else _dumps_like(walked, text)
                        return self.rest(block, {**block, "text": self._limit_only(new)}, _TEXT_FIELDS)
        return self.rest(block, {**block, "text": self._budgeted(text)}, _TEXT_FIELDS)

    def _limit_only(self, text: str) -> str:
        limit = min(self.policy.max_item_bytes, self.budget)
        out, omitted = truncate_utf8(text, limit)
        if omitted:
            self.report.bump("truncated")
            out += truncation_marker(omitted)
        self.budget = max(0, self.budget - min(limit, len(out.encode("utf-8", "surrogatepass"))))
        return out

    def content(self, blocks: list[Any], original_sc: Any, new_sc: Any, has_sc: bool) -> list[Any]:
        out: list[Any] = []
        for block in blocks:
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind == "text":
                out.append(self._text_block(block, original_sc, new_sc, has_sc))
            elif kind in _BINARY_TYPES:
                note = self._binary_ok(kind, block.get("mimeType"), block.get("data"))
                out.append(note if note is not None else self.rest(block, dict(block), _BINARY_FIELDS))
            elif kind == "resource":
                out.append(self._resource(block))
            elif kind == "resource_link":
                out.append(self._resource_link(block))
            else:
                # Fail closed on content types this version does not know how to inspect.
                self.report.bump("unknown_content")
                out.append(self._note("content of an unsupported type removed"))
        return out


def _plain_text_block(block: Any) -> bool:
    """A text block whose text ``Sanitizer._text_block`` scans as it stands (not one that may be JSON)."""
    if not isinstance(block, Mapping) or block.get("type") != "text":
        return False
    text = block.get("text")
    return isinstance(text, str) and text.lstrip()[:1] not in ("{", "[")


def sanitize_result(result: Mapping[str, Any], policy: EffectiveSanitizePolicy) -> tuple[dict[str, Any],
                                                                                          SanitizeReport]:
    """Sanitize one ``CallToolResult``. ``report.withheld`` is set when the result must not reach the client."""
    walker = Sanitizer(policy)
    walker.prescan_whole(result)
    out = dict(result)
    has_sc = "structuredContent" in result
    original_sc = result.get("structuredContent")
    new_sc = original_sc
    if has_sc:
        # Measured as received, before the walk: a value that cannot leave is not worth scanning (an upstream
        # decides how big it is, up to its message size), and structured output is never cut to fit.
        try:
            size = len(orjson.dumps(original_sc)) if original_sc is not None else 0
        except TypeError:
            size = _json_bytes(original_sc)
        if size > policy.max_result_bytes:
            return out, _oversized(walker.report, size, policy)
        try:
            new_sc = walker.json_tree(original_sc)
        except _TooDeep:
            walker.report.withheld = f"result withheld: structured output nested deeper than {MAX_DEPTH} levels"
            return out, walker.report
        if new_sc is not original_sc:
            # Redaction placeholders can be longer than what they replace.
            size = _json_bytes(new_sc)
            if size > policy.max_result_bytes:
                return out, _oversized(walker.report, size, policy)
        out["structuredContent"] = new_sc
    content = result.get("content")
    if isinstance(content, list):
        out["content"] = walker.content(content, original_sc, new_sc, has_sc)
    walker.rest(result, out, _RESULT_FIELDS)
    if policy.injection == "block" and walker.report.injection:
        walker.report.withheld = "result withheld: possible prompt injection"
    return out, walker.report


def _json_bytes(value: Any) -> int:
    if value is None:
        return 0
    try:
        return len(orjson.dumps(value))
    except TypeError:
        # What orjson does not encode (a lone surrogate, an integer beyond 64 bits) the stdlib does.
        return len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def _oversized(report: SanitizeReport, size: int, policy: EffectiveSanitizePolicy) -> SanitizeReport:
    report.bump("oversized")
    report.withheld = (f"result withheld: structured output of {size} bytes exceeds the "
                       f"{policy.max_result_bytes}-byte limit")
    return report


def sanitize_error(error: Mapping[str, Any], policy: EffectiveSanitizePolicy) -> tuple[dict[str, Any],
                                                                                        SanitizeReport]:
    """A JSON-RPC ``error`` object from an upstream: message and every string and key in ``data``.

    Values under credential keys (``password``, ``AWS_SECRET_ACCESS_KEY``...) are redacted whatever they look like;
    stack traces are cut to their message line unless ``stack_traces: keep``. There is nothing to withhold in an
    error, so ``block`` acts as ``neutralise`` here.
    """
    walker = Walker(Sanitizer(_no_block(policy)), by_key=True, one_line_traces=policy.stack_traces == "strip")
    out = dict(error)
    if isinstance(error.get("message"), str):
        out["message"] = walker.text(error["message"], "message", ERROR_MESSAGE_BYTES)
    if "data" in error:
        out["data"] = walker.value(error["data"], "data")
    return out, walker.report


CLIENT_BOUND_REQUESTS = frozenset({"sampling/createMessage", "elicitation/create"})
NOTIFICATION_IDS = frozenset({"progressToken", "progress", "total", "requestId", "uri", "level"})


def sanitize_notification(method: str, params: Mapping[str, Any],
                          policy: EffectiveSanitizePolicy) -> tuple[dict[str, Any], SanitizeReport]:
    """Every string of a notification an upstream sends (progress and log messages, ``_meta``, whatever else it
    carries), and of the requests an upstream asks a client to answer (``sampling/createMessage``,
    ``elicitation/create``), since their prompts and messages reach a model or a person.

    Protocol identifiers (``progressToken``, ``requestId``, ``uri``, ``level``) pass unchanged; values under
    credential keys are redacted. ``block`` acts as ``neutralise``.
    """
    sanitizer = Sanitizer(_no_block(policy))
    if method in CLIENT_BOUND_REQUESTS:
        # Their schemas and messages hold keys such as "password" that are questions, not secrets.
        out = sanitizer.rest(params, dict(params), frozenset())
        return out, sanitizer.report
    walker = Walker(sanitizer, by_key=True)
    out = dict(params)
    for key, value in params.items():
        if key in NOTIFICATION_IDS:
            continue
        if key == "message" and isinstance(value, str):
            out[key] = walker.text(value, key, ERROR_MESSAGE_BYTES)
        elif key == "logger" and isinstance(value, str):
            out[key] = walker.text(value, key, 256)
        else:
            new = walker.field(key, value, key)
            if new is DROP:
                del out[key]
            else:
                out[key] = new
    return out, walker.report


def _no_block(policy: EffectiveSanitizePolicy) -> EffectiveSanitizePolicy:
    return replace(policy, injection="neutralise") if policy.injection == "block" else policy


# Completion values a client shows in a picker; the protocol allows at most 100 per response.
MAX_COMPLETION_VALUES = 100
_PROMPT_RESULT_FIELDS = frozenset({"messages", "description"})
_MESSAGE_FIELDS = frozenset({"content"})
_READ_RESULT_FIELDS = frozenset({"contents"})
_CONTENTS_FIELDS = frozenset({"uri", "text", "blob", "mimeType"})


def sanitize_reply(method: str, result: Mapping[str, Any],
                   policy: EffectiveSanitizePolicy) -> tuple[dict[str, Any], SanitizeReport]:
    """The result of a forwarded ``prompts/get``, ``resources/read`` or ``completion/complete``.

    Prompt messages are content blocks like a tool result's; resource contents get their text cleaned (blobs are
    what the client asked to read, so their type is not filtered here); completion values are text. Lists are cut
    at ``max_content_blocks`` (completion values at 100). Every other member, ``_meta`` included, is walked.
    ``block`` acts as ``neutralise``: a prompt or resource the client asked for by name is not withheld.
    """
    walker = Sanitizer(_no_block(policy))
    out = dict(result)
    handled: frozenset[str] = frozenset()
    limit = policy.max_content_blocks
    if method == "prompts/get":
        handled = _PROMPT_RESULT_FIELDS
        if isinstance(result.get("description"), str):
            out["description"] = walker.string(result["description"], policy.max_item_bytes, "description")
        messages = result.get("messages")
        if isinstance(messages, list):
            out["messages"] = [_message(walker, m) for m in _capped(walker, messages, limit)]
    elif method == "resources/read":
        handled = _READ_RESULT_FIELDS
        contents = result.get("contents")
        if isinstance(contents, list):
            out["contents"] = [_contents(walker, c) for c in _capped(walker, contents, limit)]
    elif method == "completion/complete":
        completion = result.get("completion")
        if isinstance(completion, dict) and isinstance(completion.get("values"), list):
            handled = frozenset({"completion"})
            values = _capped(walker, completion["values"], MAX_COMPLETION_VALUES)
            new = {**completion, "values": [walker.string(v, 1024, "completion.values") if isinstance(v, str)
                                            else "" for v in values]}
            out["completion"] = walker.rest(completion, new, frozenset({"values", "total", "hasMore"}),
                                            "completion.")
    return walker.rest(result, out, handled), walker.report


def _capped(walker: Sanitizer, items: list[Any], limit: int) -> list[Any]:
    if len(items) <= limit:
        return items
    walker.report.add({"content_blocks_omitted": len(items) - limit})
    return items[:limit]


def _message(walker: Sanitizer, message: Any) -> Any:
    if not isinstance(message, dict):
        return walker.rest({"message": message}, {}, frozenset()).get("message")
    out = dict(message)
    content = message.get("content")
    if isinstance(content, dict):
        out["content"] = walker.content([content], None, None, False)[0]
    elif isinstance(content, list):
        out["content"] = walker.content(content, None, None, False)
    return walker.rest(message, out, _MESSAGE_FIELDS | {"role"})


def _contents(walker: Sanitizer, item: Any) -> Any:
    if not isinstance(item, dict):
        return walker.rest({"item": item}, {}, frozenset()).get("item")
    out = dict(item)
    if isinstance(item.get("text"), str):
        out["text"] = walker._budgeted(item["text"])
    if isinstance(item.get("mimeType"), str):
        out["mimeType"] = walker.string(item["mimeType"], 255)
    return walker.rest(item, out, _CONTENTS_FIELDS)
