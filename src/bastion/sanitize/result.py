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
from bastion.sanitize.text import clean_text

MAX_DEPTH = 64
ERROR_MESSAGE_BYTES = 4096
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
# Schemes a client may execute or that inline arbitrary content; every other scheme (https, file, custom
# resource schemes such as postgres:// or github://) is a name, not an action.
UNSAFE_URI_SCHEMES = frozenset({"javascript", "vbscript", "data", "blob", "livescript", "mocha"})
_BINARY_TYPES = {"image": "data", "audio": "data"}


class _TooDeep(Exception):
    pass


def truncation_marker(omitted: int) -> str:
    return f"…[truncated by bastion: {omitted} bytes omitted]"


def truncate_utf8(text: str, limit: int) -> tuple[str, int]:
    """Cut ``text`` to at most ``limit`` UTF-8 bytes on a character boundary; returns (text, bytes omitted)."""
    if len(text) * 4 <= limit:
        return text, 0
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text, 0
    kept = raw[:limit].decode("utf-8", "ignore")
    return kept, len(raw) - len(kept.encode("utf-8"))


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


class Sanitizer:
    """One walk: the policy, the report it fills, and the byte budget left for content blocks."""

    def __init__(self, policy: EffectiveSanitizePolicy, report: SanitizeReport | None = None) -> None:
        self.policy = policy
        self.report = report if report is not None else SanitizeReport()
        self.budget = policy.max_result_bytes
        # Cleared by prescan() when no secret rule or injection pattern can match anywhere in a JSON value.
        self._patterns = True

    # -- strings ---------------------------------------------------------------------------------------------

    def string(self, value: str, limit: int | None = None, where: str | None = None) -> str:
        """Clean, redact, scan for injection, then truncate (last, so a cut never splits a secret unseen)."""
        cleaned = clean_text(value)
        text = cleaned.text
        if cleaned.counts:
            self.report.add(cleaned.counts, where)
            self.report.add(self.policy.detector.hidden(value, cleaned.counts), where)
        if self._patterns:
            text, counts = self.policy.redactor.redact(text)
            if counts:
                self.report.add(counts, where)
            text, counts = self.policy.detector.apply(text, self.policy.injection)
            if counts:
                self.report.add(counts, where)
        if limit is not None:
            text, omitted = truncate_utf8(text, limit)
            if omitted:
                self.report.bump("truncated", where)
                text += truncation_marker(omitted)
        return text

    def json_tree(self, value: Any) -> Any:
        """``json_value`` with one RE2 pass over all strings first, so a clean tree of many small strings does
        not pay two pattern-set scans per string. A match spanning two strings only costs the per-string path."""
        strings: list[str] = []
        _collect(value, strings, 0)
        joined = "\n\x00\n".join(strings)
        self._patterns = self.policy.redactor.may_match(joined) or self.policy.detector.may_match(joined)
        try:
            return self.json_value(value)
        finally:
            self._patterns = True

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
                new_key = self.string(key) if isinstance(key, str) else key
                new_item = self.json_value(item, depth + 1)
                changed = changed or new_key != key or new_item is not item
                out[new_key] = new_item
            return out if changed else value
        if isinstance(value, list):
            items = [self.json_value(item, depth + 1) for item in value]
            return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
        return value

    def _budgeted(self, text: str) -> str:
        limit = min(self.policy.max_item_bytes, self.budget)
        out = self.string(text, limit)
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

    def _resource(self, block: Mapping[str, Any]) -> dict[str, Any]:
        resource = block.get("resource")
        if not isinstance(resource, Mapping):
            self.report.bump("unknown_content")
            return self._note("malformed embedded resource removed")
        uri = resource.get("uri")
        clean_uri = self.string(uri) if isinstance(uri, str) else ""
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
        return {**block, "resource": new}

    def _resource_link(self, block: Mapping[str, Any]) -> dict[str, Any]:
        uri = block.get("uri")
        clean_uri = self.string(uri) if isinstance(uri, str) else ""
        if not uri_is_safe(clean_uri):
            self.report.bump("unsafe_uri")
            return self._note("resource link removed: unsafe URI")
        new = dict(block)
        new["uri"] = clean_uri
        for key in ("name", "title", "description", "mimeType"):
            if isinstance(block.get(key), str):
                new[key] = self.string(block[key], self.policy.max_item_bytes)
        return new

    def _text_block(self, block: Mapping[str, Any], original_sc: Any, new_sc: Any, has_sc: bool) -> dict[str, Any]:
        text = block.get("text")
        if not isinstance(text, str):
            self.report.bump("unknown_content")
            return self._note("malformed text content removed")
        stripped = text.lstrip()
        if stripped[:1] in ("{", "["):
            try:
                parsed = _loads(text)
            except ValueError:
                parsed = None
            else:
                if has_sc and parsed == original_sc:
                    # The backward-compatible mirror of structuredContent: it must say what structuredContent says.
                    mirror = text if new_sc is original_sc else _dumps_like(new_sc, text)
                    return {**block, "text": self._limit_only(mirror)}
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
                        return {**block, "text": self._limit_only(new)}
        return {**block, "text": self._budgeted(text)}

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
                out.append(note if note is not None else block)
            elif kind == "resource":
                out.append(self._resource(block))
            elif kind == "resource_link":
                out.append(self._resource_link(block))
            else:
                # Fail closed on content types this version does not know how to inspect.
                self.report.bump("unknown_content")
                out.append(self._note("content of an unsupported type removed"))
        return out


def sanitize_result(result: Mapping[str, Any], policy: EffectiveSanitizePolicy) -> tuple[dict[str, Any],
                                                                                          SanitizeReport]:
    """Sanitize one ``CallToolResult``. ``report.withheld`` is set when the result must not reach the client."""
    walker = Sanitizer(policy)
    out = dict(result)
    has_sc = "structuredContent" in result
    original_sc = result.get("structuredContent")
    new_sc = original_sc
    if has_sc:
        try:
            new_sc = walker.json_tree(original_sc)
        except _TooDeep:
            walker.report.withheld = f"result withheld: structured output nested deeper than {MAX_DEPTH} levels"
            return out, walker.report
        size = len(orjson.dumps(new_sc)) if new_sc is not None else 0
        if size > policy.max_result_bytes:
            walker.report.bump("oversized")
            walker.report.withheld = (f"result withheld: structured output of {size} bytes exceeds the "
                                      f"{policy.max_result_bytes}-byte limit")
            return out, walker.report
        out["structuredContent"] = new_sc
    content = result.get("content")
    if isinstance(content, list):
        out["content"] = walker.content(content, original_sc, new_sc, has_sc)
    if policy.injection == "block" and walker.report.injection:
        walker.report.withheld = "result withheld: possible prompt injection"
    return out, walker.report


def sanitize_error(error: Mapping[str, Any], policy: EffectiveSanitizePolicy) -> tuple[dict[str, Any],
                                                                                        SanitizeReport]:
    """A JSON-RPC ``error`` object from an upstream: message and every string in ``data``.

    There is nothing to withhold in an error, so ``block`` acts as ``neutralise`` here.
    """
    walker = Sanitizer(_no_block(policy))
    out = dict(error)
    if isinstance(error.get("message"), str):
        out["message"] = walker.string(error["message"], ERROR_MESSAGE_BYTES)
    if "data" in error:
        out["data"] = _safe_json(walker, error["data"])
    return out, walker.report


CLIENT_BOUND_REQUESTS = frozenset({"sampling/createMessage", "elicitation/create"})


def sanitize_notification(method: str, params: Mapping[str, Any],
                          policy: EffectiveSanitizePolicy) -> tuple[dict[str, Any], SanitizeReport]:
    """``notifications/progress`` (``message``), ``notifications/message`` (``logger``, ``data``), and the
    requests an upstream asks a client to answer (``sampling/createMessage``, ``elicitation/create``: every string,
    since their prompts and messages reach a model or a person).

    Other notifications are returned unchanged. ``block`` acts as ``neutralise``.
    """
    walker = Sanitizer(_no_block(policy))
    out = dict(params)
    if method in CLIENT_BOUND_REQUESTS:
        cleaned = _safe_json(walker, dict(params))
        return (cleaned if isinstance(cleaned, dict) else out), walker.report
    if method == "notifications/progress" and isinstance(params.get("message"), str):
        out["message"] = walker.string(params["message"], ERROR_MESSAGE_BYTES)
    elif method == "notifications/message":
        if isinstance(params.get("logger"), str):
            out["logger"] = walker.string(params["logger"], 256)
        if "data" in params:
            out["data"] = _safe_json(walker, params["data"])
    return out, walker.report


def _collect(value: Any, out: list[str], depth: int) -> None:
    if isinstance(value, str):
        out.append(value)
    elif depth > MAX_DEPTH:
        return
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                out.append(key)
            _collect(item, out, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _collect(item, out, depth + 1)


def _safe_json(walker: Sanitizer, value: Any) -> Any:
    try:
        return walker.json_tree(value)
    except _TooDeep:
        walker.report.bump("oversized")
        return "[bastion: data removed: nested too deeply]"


def _no_block(policy: EffectiveSanitizePolicy) -> EffectiveSanitizePolicy:
    return replace(policy, injection="neutralise") if policy.injection == "block" else policy
