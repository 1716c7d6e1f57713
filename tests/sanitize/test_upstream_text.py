"""Upstream text outside tool results: a notification that several calls receive is cleaned once."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.sanitize import upstream_text
from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.upstream_text import UpstreamTextCleaner

LEAKY = "AKIAIOSFODNN7EXAMPLE"


def counting(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    real = upstream_text.sanitize_notification

    def wrapped(method: str, params: dict[str, Any], policy: Any) -> Any:
        seen.append(params)
        return real(method, params, policy)

    monkeypatch.setattr(upstream_text, "sanitize_notification", wrapped)
    return seen


def test_one_message_handed_to_several_calls_is_cleaned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = counting(monkeypatch)
    cleaner = UpstreamTextCleaner(SanitizeConfig.from_mapping(None))
    message = {"level": "info", "data": f"key {LEAKY}"}
    outs = [cleaner.clean_notification("up", "notifications/message", message) for _ in range(5)]
    assert len(seen) == 1
    assert all(out == outs[0] and LEAKY not in str(out) for out in outs)
    assert len({id(out) for out in outs}) == 5  # each receiver gets its own dict
    # An equal message that is another object is another message (it may be a second, identical log line).
    cleaner.clean_notification("up", "notifications/message", dict(message))
    assert len(seen) == 2


def test_the_same_object_under_another_method_or_policy_is_cleaned_again(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = counting(monkeypatch)
    cleaner = UpstreamTextCleaner(SanitizeConfig.from_mapping({"upstreams": {"strict": {"injection": "block"}}}))
    message = {"progressToken": 1, "progress": 1, "message": f"key {LEAKY}"}
    cleaner.clean_notification("up", "notifications/progress", message)
    cleaner.clean_notification("up", "notifications/message", message)
    cleaner.clean_notification("strict", "notifications/message", message)
    assert len(seen) == 3
