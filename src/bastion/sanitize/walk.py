"""One traversal over the MCP shapes: which strings are text, which are links, which are keys that must not move.

Every string an upstream sends is text by default, so a field a new protocol revision adds is in scope without
an edit here. The walker knows the exceptions:

- **links** (``icons[].src``, ``websiteUrl``): checked by ``links.link_allowed``; an unsafe icon is dropped from
  its list, an unsafe ``websiteUrl`` is removed;
- **credential keys** (``password``, ``AWS_SECRET_ACCESS_KEY``...; ``links.secret_key``): with ``by_key`` their
  string values are redacted whatever they look like (error data, notifications, ``_meta``, schema defaults);
- **identifiers** (``keep``): names clients send back or route by (tool and prompt names, argument names, resource
  URIs) and JSON Schema keywords that decide validation (property names, ``enum``, ``const``, ``pattern``,
  ``required``...). Rewriting them would change what the tool accepts, so they are scanned but never rewritten;
  a finding in one lands in ``semantic`` and the caller decides (a definition is blocked, see ``definitions``).

Pure apart from the report it fills. Containers that needed no change come back as the same objects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Set
from dataclasses import replace
from typing import Any

from bastion.sanitize.links import link_allowed, secret_key
from bastion.sanitize.report import SanitizeReport
from bastion.sanitize.strings import StringSanitizer
from bastion.sanitize.traces import one_line

MAX_DEPTH = 64
KEY_BYTES = 1024
TOO_DEEP = "[bastion: removed: nested too deeply]"
HIDDEN_MARK = " [bastion: hidden characters removed]"
LINK_KEYS = frozenset({"websiteUrl"})
ICON_KEYS = frozenset({"icons"})
DROP: Any = object()  # returned by ``Walker.field`` for a member that must be removed

# JSON Schema keywords holding subschemas by name (the names are property names: identifiers) or directly.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_SCHEMA_SUBS = frozenset({"items", "prefixItems", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
                          "contains", "additionalProperties", "unevaluatedProperties", "unevaluatedItems",
                          "propertyNames", "additionalItems", "contentSchema"})
# Keywords whose strings decide what validates: never rewritten.
_SCHEMA_SEMANTIC = frozenset({"enum", "const", "pattern", "required", "dependentRequired", "type", "format",
                              "$ref", "$id", "$schema", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary",
                              "$recursiveRef", "$recursiveAnchor", "contentEncoding", "contentMediaType",
                              "dependencies"})
# Annotations a client may prefill or show as sample values: redacted wholesale under a credential property.
_SCHEMA_VALUES = frozenset({"default", "examples"})

# Report count keys -> the finding classes of docs/security.md ("Definitions").
_INVISIBLE = frozenset({"tag", "bidi", "bidi_mark", "escape_string", "escape", "control", "zero_width",
                        "variation_selector"})


def finding_class(key: str) -> str | None:
    """The finding class of one report count key, or None for routine clean-up (spaces, truncation)."""
    if key.startswith("secret:"):
        return "secret"
    if key == "injection:hidden-text":
        return "invisible_characters"
    if key.startswith("injection:hidden-"):
        return "hidden_instruction"
    if key == "injection:directive-tag":
        return "directive_tag"
    if key.startswith("injection:"):
        return "injection"
    if key in _INVISIBLE:
        return "invisible_characters"
    if key in ("cross_tool_reference", "unsafe_url"):
        return key
    if key == "unsafe_uri":
        return "unsafe_url"
    if key == "oversized":
        return "oversize"
    return None


def finding_classes(counts: Mapping[str, int]) -> set[str]:
    return {c for c in map(finding_class, counts) if c is not None}


class ToolRefs:
    """Names of tools served by other upstreams, to spot a definition that steers the model towards them.

    Only distinctive names count (containing ``_``, ``.``, ``-``, a digit or an inner capital, at least 4
    characters): a tool called ``search`` elsewhere must not turn every use of the word into a finding.
    """

    __slots__ = ("_names",)

    def __init__(self, names: Set[str]) -> None:
        self._names = frozenset(n for n in names if _distinctive(n))

    def __bool__(self) -> bool:
        return bool(self._names)

    def without(self, names: Set[str]) -> ToolRefs:
        """These references less ``names`` (distinctiveness is per name, so nothing is filtered again)."""
        out = ToolRefs(frozenset())
        out._names = self._names - names
        return out

    def absent_from(self, text: str) -> bool:
        """True when no token of ``text`` is one of the names (``apply`` would find nothing)."""
        return not self._names or self._names.isdisjoint(_CANDIDATES.findall(text))

    def apply(self, text: str, neutralise: bool) -> tuple[str, int]:
        if not self._names or self._names.isdisjoint(_CANDIDATES.findall(text)):
            # The common case, a text naming no other server's tool, found by one C-speed pass.
            return text, 0
        found = 0
        parts: list[str] = []
        pos = 0
        for start, end in _tokens(text):
            token = text[start:end].rstrip(".-")
            if token in self._names:
                found += 1
                if neutralise:
                    parts.append(text[pos:start])
                    parts.append(f'[bastion: reference to a tool of another server: "{token}"]')
                    pos = start + len(token)
        if not neutralise or not found:
            return text, found
        parts.append(text[pos:])
        return "".join(parts), found


# The tokens ``apply`` compares with tool names, as ``_tokens`` cuts them (maximal runs of ASCII letters, digits
# and ``_.-``) with their trailing ``.`` and ``-`` removed. A run of only ``.`` and ``-`` yields no candidate; its
# token would be empty, which is no name.
_CANDIDATES = re.compile(r"([A-Za-z0-9_.\-]*[A-Za-z0-9_])[.\-]*")
# ``_distinctive`` for ASCII names: a separator or digit anywhere, or a capital after the first character.
_MARK = re.compile(r"[_.\-0-9]")
_INNER_CAPITAL = re.compile(r"[A-Z]")


def _distinctive(name: str) -> bool:
    if len(name) < 4:
        return False
    if name.isascii():
        return _MARK.search(name) is not None or _INNER_CAPITAL.search(name, 1) is not None
    return any(c in "_.-" or c.isdigit() for c in name) or any(c.isupper() for c in name[1:])


def _tokens(text: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    start = -1
    for i, c in enumerate(text):
        word = c.isascii() and (c.isalnum() or c in "_.-")
        if word and start < 0:
            start = i
        elif not word and start >= 0:
            spans.append((start, i))
            start = -1
    if start >= 0:
        spans.append((start, len(text)))
    return spans


class Walker:
    """One walk of one item: the ``StringSanitizer`` that cleans strings, plus what this shape needs on top."""

    def __init__(self, sanitizer: StringSanitizer, *, by_key: bool = False, mark_hidden: bool = False,
                 refs: ToolRefs | None = None, neutralise_refs: bool = False, one_line_traces: bool = False,
                 limit: int | None = None) -> None:
        self.s = sanitizer
        self.by_key = by_key
        self.mark_hidden = mark_hidden
        self.refs = refs if refs else None
        self.neutralise_refs = neutralise_refs
        self.one_line_traces = one_line_traces
        self.limit = limit if limit is not None else sanitizer.policy.max_item_bytes
        # Finding classes in fields that cannot be rewritten (identifiers, validation keywords).
        self.semantic: set[str] = set()
        self._probe: Walker | None = None
        self._meta: Walker | None = None
        # Set by ``prescan``: no string of the item names another server's tool.
        self._refs_absent = False

    @property
    def report(self) -> SanitizeReport:
        return self.s.report

    # -- leaves ----------------------------------------------------------------------------------------------

    def text(self, value: str, where: str | None = None, limit: int | None = None, key: str | None = None) -> str:
        """One string; ``key``: the object key it sits under, which the secret rules see before it."""
        given = value
        if self.one_line_traces:
            reduced = one_line(value)
            if reduced is not None:
                self.report.bump("stack_trace", where)
                value = reduced
        # Printable ASCII has nothing to hide: skip counting before and after.
        marking = self.mark_hidden and not (value.isascii() and value.isprintable())
        hidden_before = self._hidden() if marking else 0
        # A cut trace is a new text (its message line and a marker): no prescan judged it.
        out = self.s.string(value, limit if limit is not None else self.limit, where, unseen=value is not given,
                            key=key)
        if self.refs is not None and not (self._refs_absent and out is given):
            out, n = self.refs.apply(out, self.neutralise_refs)
            if n:
                self.report.add({"cross_tool_reference": n}, where)
        if marking and self._hidden() > hidden_before:
            out += HIDDEN_MARK
        return out

    def _hidden(self) -> int:
        return sum(n for k, n in self.report.counts.items() if k in _INVISIBLE)

    def keep(self, value: Any, where: str) -> Any:
        """Scan an identifier (or a validation keyword's value) without rewriting it; findings go to ``semantic``."""
        if self._plain(value, 0):
            return value  # the common case, a printable ASCII name no pattern can match: no probe walk
        if self._probe is None:
            self._probe = Walker(StringSanitizer(replace(self.s.policy, injection="flag")))
        probe = self._probe
        probe.s.report = SanitizeReport()
        cleaned = probe.value(value, where)
        classes = finding_classes(probe.report.counts)
        if cleaned != value and not classes:
            classes = {"invisible_characters"}  # e.g. a key that only differs by what cleaning normalised
        if classes:
            self.semantic |= classes
            self.report.add(probe.report.counts)
            for finding in probe.report.findings:
                self.report.findings.append(finding)
        return value

    def prescan(self, value: Any) -> None:
        """One RE2 pass per pattern set over all strings of ``value`` (keys included): when nothing can match
        anywhere, the per-string passes are skipped for the whole walk (``Sanitizer.json_tree`` does the same)."""
        joined = self.s.prescan(value)
        # Tokens never span two strings (the separator is no word character): when no token of any string of
        # ``value`` names another server's tool, a text this walk leaves unchanged cannot either. (Cleaning can
        # join two runs into a name, so a changed text is still looked at.)
        self._refs_absent = joined is not None and self.refs is not None and self.refs.absent_from(joined)

    def _plain(self, value: Any, depth: int) -> bool:
        if isinstance(value, str):
            if not value.isascii() or not value.isprintable():
                return False
            policy = self.s.policy
            return not self.s.patterns or (not policy.redactor.may_match(value)
                                           and not policy.detector.may_match(value))
        if isinstance(value, list) and depth < 2:
            return all(self._plain(v, depth + 1) for v in value)
        return value is None or isinstance(value, bool | int | float)

    def link(self, value: Any, where: str) -> bool:
        ok = isinstance(value, str) and link_allowed(value, self.s.policy.allow_http_links)
        if not ok:
            self.report.bump("unsafe_url", where)
        return ok

    # -- free JSON -------------------------------------------------------------------------------------------

    def value(self, value: Any, where: str = "", depth: int = 0, secret: bool = False, key: Any = None) -> Any:
        """Every string of a JSON value; links checked, credential keys redacted (``by_key``). ``key``: the
        object key ``value`` is the member of, if any (the secret rules see a string with its key)."""
        if isinstance(value, str):
            if secret and value:
                self.report.bump("secret:key-name", where)
                return "[REDACTED:key-name]"
            return self.text(value, where, key=key if isinstance(key, str) else None)
        if depth > MAX_DEPTH:
            self.report.bump("oversized", where)
            return TOO_DEEP
        if isinstance(value, dict):
            return self._object(value, where, depth, secret)
        if isinstance(value, list):
            items = [self.value(item, f"{where}[{i}]", depth + 1, secret) for i, item in enumerate(value)]
            return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
        return value

    def _object(self, obj: dict[Any, Any], where: str, depth: int, secret: bool) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        changed = False
        for key, item in obj.items():
            path = f"{where}.{key}" if where else str(key)
            new_item = self.field(key, item, path, depth, secret)
            if new_item is DROP:
                changed = True
                continue
            new_key = self.text(key, path, KEY_BYTES) if isinstance(key, str) else key
            changed = changed or new_key != key or new_item is not item
            out[new_key] = new_item
        return out if changed else obj

    def field(self, key: Any, item: Any, path: str, depth: int = 0, secret: bool = False) -> Any:
        """One member of an object, by what its key says it is; ``DROP`` when it must be removed."""
        if key in ICON_KEYS:
            if isinstance(item, list):
                return self._icons(item, path, depth)
            self.report.bump("unsafe_url", path)  # icons that are not a list of icons: nothing to vet
            return DROP
        if key in LINK_KEYS:
            return item if self.link(item, path) else DROP
        if key == "_meta" and not self.by_key:
            # _meta anywhere is an extension point: credential keys in it are redacted by name.
            if self._meta is None:
                self._meta = Walker(self.s, by_key=True, mark_hidden=self.mark_hidden, refs=self.refs,
                                    neutralise_refs=self.neutralise_refs, one_line_traces=self.one_line_traces,
                                    limit=self.limit)
            return self._meta.value(item, path, depth + 1, secret, key)
        hides = secret or (self.by_key and isinstance(key, str) and secret_key(key))
        return self.value(item, path, depth + 1, hides, key)

    def _icons(self, icons: list[Any], where: str, depth: int) -> list[Any]:
        kept: list[Any] = []
        for i, icon in enumerate(icons):
            if not isinstance(icon, dict) or not self.link(icon.get("src"), f"{where}[{i}].src"):
                continue
            rest = {k: v for k, v in icon.items() if k != "src"}
            walked = self.value(rest, f"{where}[{i}]", depth + 1)
            kept.append(icon if walked is rest else {"src": icon["src"], **walked})
        return kept if len(kept) != len(icons) or any(a is not b for a, b in zip(kept, icons, strict=True)) \
            else icons

    # -- JSON Schema -----------------------------------------------------------------------------------------

    def schema(self, node: Any, where: str, depth: int = 0, secret: bool = False) -> Any:
        """Annotations (``title``, ``description``, ``default``, ``examples``, unknown keywords) are text;
        property names and validation keywords are identifiers (``keep``)."""
        if depth > MAX_DEPTH:
            self.semantic.add("oversize")
            return node
        if isinstance(node, list):
            items = [self.schema(n, f"{where}[{i}]", depth + 1, secret) for i, n in enumerate(node)]
            return items if any(a is not b for a, b in zip(items, node, strict=True)) else node
        if not isinstance(node, dict):
            return node
        # Like ``value``, a node that needed no change comes back as the same object: a clean definition shares
        # its schemas with what the upstream sent, instead of holding a second copy of every node.
        out: dict[Any, Any] = {}
        changed = False
        for key, value in node.items():
            path = f"{where}.{key}"
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                subs = {self.keep(name, f"{path}.{name}"):
                        self.schema(sub, f"{path}.{name}", depth + 1, isinstance(name, str) and secret_key(name))
                        for name, sub in value.items()}
                # ``keep`` returns every name as it was, so only the subschemas can differ.
                new = subs if any(subs[name] is not sub for name, sub in value.items()) else value
            elif key in _SCHEMA_SUBS:
                new = self.schema(value, path, depth + 1, False)
            elif key in _SCHEMA_SEMANTIC or key in _SCHEMA_MAPS:
                new = self.keep(value, path)
            elif key in _SCHEMA_VALUES:
                new = self.value(value, path, depth + 1, secret, key)
            else:
                new_key = self.text(key, path, KEY_BYTES) if isinstance(key, str) else key
                new = self.value(value, path, depth + 1, key=key)
                if new_key != key:
                    changed = True
                    out[new_key] = new
                    continue
            changed = changed or new is not value
            out[key] = new
        return out if changed else node
