"""Upstream text that reaches clients outside tool results, cleaned under the upstream's sanitize policy.

Tool results are sanitized by the pipeline's ``SanitizeGuard``; this is everything else an upstream writes that a
client (and so a model) reads: progress and log notifications and questions for the client
(``clean_notification``), error messages (``clean_error``), and the results of forwarded ``prompts/get``,
``resources/read`` and ``completion/complete`` (``clean_result``). Each judges the upstream under its own
``sanitize`` policy and passes the text through untouched when that policy is off.
"""

from __future__ import annotations

from typing import Any

from bastion.sanitize.config import EffectiveSanitizePolicy, SanitizeConfig
from bastion.sanitize.result import sanitize_error, sanitize_notification, sanitize_reply


class UpstreamTextCleaner:
    def __init__(self, config: SanitizeConfig) -> None:
        self._config = config
        # The last notification cleaned and what it became. A stdio upstream's log message that several calls
        # receive (``upstream.session``'s fan-out) reaches each of their relays as the same object: it is
        # cleaned once, not once per receiving call, so an upstream that floods log messages cannot multiply
        # the sanitizer's work by the calls in flight.
        self._last: tuple[dict[str, Any], str, EffectiveSanitizePolicy, dict[str, Any]] | None = None

    def clean_notification(self, upstream: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        policy = self._config.for_upstream(upstream)
        if not policy.enabled:
            return params
        last = self._last
        if last is not None and last[0] is params and last[1] == method and last[2] is policy:
            return dict(last[3])
        cleaned = sanitize_notification(method, params, policy)[0]
        self._last = (params, method, policy, cleaned)
        return dict(cleaned)

    def clean_error(self, upstream: str, error: dict[str, Any]) -> dict[str, Any]:
        policy = self._config.for_upstream(upstream)
        return sanitize_error(error, policy)[0] if policy.enabled else error

    def clean_result(self, upstream: str, method: str, result: dict[str, Any]) -> dict[str, Any]:
        policy = self._config.for_upstream(upstream)
        return sanitize_reply(method, result, policy)[0] if policy.enabled else result
