"""Sealing the requestState bastion hands to modern clients."""

from __future__ import annotations

import pytest

from bastion.errors import INVALID_PARAMS, ConfigError
from bastion.server.state import (
    InvalidRequestState,
    RoundTrip,
    StateConfig,
    StateSealer,
    request_digest,
)

KEY = "k" * 32
PARAMS = {"name": "files__delete", "arguments": {"path": "/tmp/x"}}


def sealer(key: str = KEY, ttl: float = 60) -> StateSealer:
    return StateSealer(StateConfig.from_mapping({"state_key": key, "state_ttl": ttl}, environ={}))


def digest(params: dict[str, object] = PARAMS, method: str = "tools/call", target: str = "files__delete") -> str:
    return request_digest(method, target, params)


def seal(s: StateSealer, state: str | None = "upstream-state", principal: str = "alice", now: float = 1000) -> str:
    return s.seal(principal_id=principal, digest=digest(), upstream="files", upstream_state=state, now=now)


def refused(s: StateSealer, token: object, *, principal: str = "alice", d: str | None = None,
            now: float = 1001) -> str:
    with pytest.raises(InvalidRequestState) as info:
        s.open(token, principal_id=principal, digest=d or digest(), now=now)
    assert info.value.code == INVALID_PARAMS and info.value.http_status == 400
    assert KEY not in info.value.message
    return info.value.message


def test_round_trip_returns_the_upstream_and_its_state() -> None:
    s = sealer()
    assert s.open(seal(s), principal_id="alice", digest=digest(), now=1001) == RoundTrip("files", "upstream-state")
    assert s.open(seal(s, None), principal_id="alice", digest=digest(), now=1001) == RoundTrip("files", None)


def test_token_does_not_reveal_the_principal() -> None:
    assert "alice" not in seal(sealer())


def test_per_round_fields_do_not_change_the_digest_but_arguments_do() -> None:
    retried = {**PARAMS, "inputResponses": {"ok": {}}, "requestState": "x", "_meta": {"a": 1}}
    assert digest(retried) == digest()
    assert digest({"name": "files__delete", "arguments": {"path": "/etc"}}) != digest()
    assert digest(method="prompts/get") != digest()


def test_tampered_expired_foreign_and_misapplied_tokens_are_refused() -> None:
    s = sealer()
    token = seal(s)
    head, body, mac = token.rsplit(".", 2)
    flipped = head + "." + body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1] + "." + mac
    assert "signature" in refused(s, flipped)
    assert "expired" in refused(s, token, now=1000 + 60)
    assert "another principal" in refused(s, token, principal="mallory")
    assert "different request" in refused(s, token, d=digest({"name": "files__delete", "arguments": {}}))
    assert "signature" in refused(sealer("z" * 32), token)
    for junk in (None, 42, "", "upstream-state", "bastion.rs1.!!!.???", "bastion.rs1.a.b.c"):
        refused(s, junk)


def test_per_process_keys_differ() -> None:
    one, two = StateSealer(StateConfig()), StateSealer(StateConfig())
    assert not one.shared
    token = one.seal(principal_id="a", digest="d", upstream="u", upstream_state=None, now=0)
    with pytest.raises(InvalidRequestState):
        two.open(token, principal_id="a", digest="d", now=1)


def test_config_from_env_and_errors() -> None:
    assert StateConfig.from_mapping(None, environ={"BASTION_STATE_KEY": KEY}).key == KEY.encode()
    assert StateConfig.from_mapping({}, environ={}) == StateConfig()
    with pytest.raises(ConfigError) as info:
        StateConfig.from_mapping({"state_key": "short"}, environ={})
    assert info.value.path == "sessions.state_key"
    with pytest.raises(ConfigError) as info:
        StateConfig.from_mapping({"state_ttl": 0}, environ={})
    assert info.value.path == "sessions.state_ttl"
