"""The ``sanitize`` config section, resolved per upstream and per tool into immutable effective policies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import structlog

from bastion.errors import ConfigError
from bastion.sanitize.injection import INJECTION_ACTIONS, InjectionAction, InjectionDetector
from bastion.sanitize.secrets import Redactor, SecretsPolicy

log = structlog.get_logger("bastion.sanitize")

DEFAULT_MAX_RESULT_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_ITEM_BYTES = 2 * 1024 * 1024
# SVG is left out on purpose: it can carry script and external references.
DEFAULT_ALLOWED_MIME_TYPES: tuple[str, ...] = (
    "image/png", "image/jpeg", "image/gif", "image/webp", "image/avif", "image/bmp",
    "audio/wav", "audio/x-wav", "audio/mpeg", "audio/mp4", "audio/aac", "audio/ogg", "audio/webm", "audio/flac",
)

DEFAULT_MAX_CONTENT_BLOCKS = 1000
DefinitionMode = Literal["flag", "neutralise", "block"]
DEFINITION_MODES: tuple[DefinitionMode, ...] = ("flag", "neutralise", "block")
StackTraces = Literal["strip", "keep"]

_LEVEL_KEYS = frozenset({"enabled", "injection", "max_result_bytes", "max_item_bytes", "allowed_mime_types",
                         "secrets", "definitions", "max_content_blocks", "allow_http_links", "stack_traces"})
_TOP_KEYS = _LEVEL_KEYS | {"upstreams"}
_UPSTREAM_KEYS = _LEVEL_KEYS | {"tools"}


@dataclass(frozen=True, slots=True)
class EffectiveSanitizePolicy:
    """Everything sanitizing one tool's results needs, compiled. Shared by every call of that tool."""

    enabled: bool = True
    injection: InjectionAction = "flag"
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES
    allowed_mime_types: frozenset[str] = frozenset(DEFAULT_ALLOWED_MIME_TYPES)
    secrets: SecretsPolicy = field(default_factory=SecretsPolicy)
    redactor: Redactor = field(default_factory=lambda: Redactor.from_policy(SecretsPolicy()), compare=False)
    detector: InjectionDetector = field(default_factory=InjectionDetector, compare=False)
    # What a finding in a tool, prompt, resource or instructions text does (docs/security.md, "Definitions").
    definitions: DefinitionMode = "neutralise"
    # Content blocks one result may carry; the rest is cut and replaced by one marker block.
    max_content_blocks: int = DEFAULT_MAX_CONTENT_BLOCKS
    # Icons and websiteUrl: https: and data:image/(png|jpeg|gif|webp) always; http: only when this is true.
    allow_http_links: bool = False
    # Stack traces in upstream error messages and error data: reduced to one line, or kept.
    stack_traces: StackTraces = "strip"

    def mime_allowed(self, mime: str) -> bool:
        mime = mime.split(";", 1)[0].strip().lower()
        return mime in self.allowed_mime_types or f"{mime.split('/', 1)[0]}/*" in self.allowed_mime_types


def _positive_int(value: Any, path: str, what: str = "number of bytes") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"expected a positive integer {what}", path=path)
    return value


def _check_keys(data: Any, allowed: frozenset[str], path: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError("expected a mapping", path=path)
    unknown = set(data) - allowed
    if unknown:
        raise ConfigError(f"unknown key(s): {', '.join(sorted(map(str, unknown)))}", path=path)
    return data


class _Compiler:
    """Builds effective policies, compiling each distinct secrets policy once."""

    def __init__(self, detector: InjectionDetector) -> None:
        self._detector = detector
        self._redactors: dict[SecretsPolicy, Redactor] = {}

    def level(self, data: Mapping[str, Any], path: str, base: EffectiveSanitizePolicy) -> EffectiveSanitizePolicy:
        enabled = data.get("enabled", base.enabled)
        if not isinstance(enabled, bool):
            raise ConfigError("expected true or false", path=f"{path}.enabled")
        injection = data.get("injection", base.injection)
        if injection not in INJECTION_ACTIONS:
            raise ConfigError(f"expected one of {', '.join(INJECTION_ACTIONS)}", path=f"{path}.injection")
        max_result = _positive_int(data.get("max_result_bytes", base.max_result_bytes), f"{path}.max_result_bytes")
        max_item = _positive_int(data.get("max_item_bytes", base.max_item_bytes), f"{path}.max_item_bytes")
        mimes = base.allowed_mime_types
        if "allowed_mime_types" in data:
            raw = data["allowed_mime_types"]
            if not isinstance(raw, list) or not all(isinstance(m, str) and "/" in m for m in raw):
                raise ConfigError("expected a list of MIME types such as image/png or image/*",
                                  path=f"{path}.allowed_mime_types")
            mimes = frozenset(m.strip().lower() for m in raw)
        secrets = base.secrets
        if "secrets" in data:
            secrets = SecretsPolicy.from_mapping(data["secrets"], f"{path}.secrets", base=base.secrets)
        redactor = self._redactors.get(secrets)
        if redactor is None:
            redactor = self._redactors[secrets] = Redactor.from_policy(secrets)
        definitions = data.get("definitions", base.definitions)
        if definitions not in DEFINITION_MODES:
            raise ConfigError(f"expected one of {', '.join(DEFINITION_MODES)}", path=f"{path}.definitions")
        max_blocks = _positive_int(data.get("max_content_blocks", base.max_content_blocks),
                                   f"{path}.max_content_blocks", "number of content blocks")
        allow_http = data.get("allow_http_links", base.allow_http_links)
        if not isinstance(allow_http, bool):
            raise ConfigError("expected true or false", path=f"{path}.allow_http_links")
        traces = data.get("stack_traces", base.stack_traces)
        if traces not in ("strip", "keep"):
            raise ConfigError("expected one of strip, keep", path=f"{path}.stack_traces")
        return EffectiveSanitizePolicy(enabled, injection, max_result, max_item, mimes, secrets, redactor,
                                       self._detector, definitions=cast(DefinitionMode, definitions),
                                       max_content_blocks=max_blocks, allow_http_links=allow_http,
                                       stack_traces=cast(StackTraces, traces))


@dataclass(frozen=True, slots=True)
class SanitizeConfig:
    """Resolved at load time: ``for_tool`` is a dictionary lookup on the hot path."""

    default: EffectiveSanitizePolicy = field(default_factory=EffectiveSanitizePolicy)
    upstreams: Mapping[str, EffectiveSanitizePolicy] = field(default_factory=dict)
    tools: Mapping[tuple[str, str], EffectiveSanitizePolicy] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, path: str = "sanitize") -> SanitizeConfig:
        data = _check_keys(data if data is not None else {}, _TOP_KEYS, path)
        detector = InjectionDetector()
        compiler = _Compiler(detector)
        default = compiler.level(data, path, EffectiveSanitizePolicy(detector=detector))
        upstreams: dict[str, EffectiveSanitizePolicy] = {}
        tools: dict[tuple[str, str], EffectiveSanitizePolicy] = {}
        raw_upstreams = _check_keys(data.get("upstreams", {}), frozenset(data.get("upstreams", {}) or ()),
                                    f"{path}.upstreams")
        for name, section in raw_upstreams.items():
            upath = f"{path}.upstreams.{name}"
            section = _check_keys(section, _UPSTREAM_KEYS, upath)
            upstream = upstreams[str(name)] = compiler.level(section, upath, default)
            raw_tools = _check_keys(section.get("tools", {}), frozenset(section.get("tools", {}) or ()),
                                    f"{upath}.tools")
            for tool, tsection in raw_tools.items():
                tpath = f"{upath}.tools.{tool}"
                tools[(str(name), str(tool))] = compiler.level(_check_keys(tsection, _LEVEL_KEYS, tpath), tpath,
                                                              upstream)
        fallback = max(p.redactor.fallback_count for p in (default, *upstreams.values(), *tools.values()))
        if fallback:
            log.warning("sanitize_rules_not_linear", count=fallback,
                        detail="some secret rules use syntax RE2 lacks and run on Python re (no ReDoS guarantee)")
        return cls(default, upstreams, tools)

    def redact_text(self, text: str) -> str:
        """``text`` with the secrets the default policy's rules find replaced (``[REDACTED:<rule-id>]``): what
        the audit log applies to the text a client sent before writing it down (``bastion.audit.record``)."""
        return self.default.redactor.redact(text)[0]

    def for_tool(self, upstream: str, tool: str) -> EffectiveSanitizePolicy:
        """The policy for ``tool`` (its upstream-side name) of ``upstream``: tool, then upstream, then default."""
        return self.tools.get((upstream, tool)) or self.upstreams.get(upstream) or self.default

    def for_upstream(self, upstream: str) -> EffectiveSanitizePolicy:
        return self.upstreams.get(upstream) or self.default
