"""Secret rules that need a key before its value see parsed JSON members as ``"<key>": "<value>"``.

``generic-secret``, ``aws-secret-key`` and ``gcp-service-account-key-id`` are written for the text of a member.
Parsed JSON hands the walk the key and the value apart, so before this fix ``{"password": "Xk9mQ2vL8pR4tZ7w"}``
passed in ``structuredContent`` while the same text in a plain block was redacted. The reference here is always
that plain block: a value in any place a walk reaches comes out as it would inside ``"<key>": "<value>"`` as
plain text (or wholesale ``[REDACTED:key-name]`` where credential keys are redacted by name).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.definitions import sanitize_tool_definition
from bastion.sanitize.links import secret_key
from bastion.sanitize.result import Sanitizer, sanitize_error, sanitize_notification, sanitize_reply, sanitize_result
from bastion.sanitize.secrets import Redactor, SecretsPolicy, member_text, members_text
from bastion.sanitize.strings import StringSanitizer
from tests.sanitize.test_secrets import NEGATIVE, POSITIVE

DEFAULT = SanitizeConfig.from_mapping({}).default
REDACTOR = Redactor.from_policy(SecretsPolicy())

# One assignment, the whole sample: a key, then the value (quotes and a line break around it are not the value).
_ASSIGNMENT = re.compile(r'\s*"?(?P<key>[A-Za-z0-9_.-]+)"?\s*(?:[:=]|=>|:=)\s*"?(?P<value>[^"\n]*?)"?\n?')


def _keyed_samples() -> list[tuple[str, str, str]]:
    """(rule, key, value) for every sample of the pack's corpus that is one assignment of a value to a key."""
    out = []
    for rule, text, _ in POSITIVE:
        m = _ASSIGNMENT.fullmatch(text)
        if m is not None:
            out.append((rule, m.group("key"), m.group("value")))
    return out


KEYED = _keyed_samples()
# The rules that need the key: their sample value alone is not redacted, the member as text is.
KEY_CONTEXT_RULES = {rule for rule, key, value in KEYED
                     if REDACTOR.redact(value)[0] == value and REDACTOR.redact(member_text(key, value))[0]
                     != member_text(key, value)}


def test_the_corpus_covers_the_key_context_rules() -> None:
    # A new rule that needs its key shows up here through its positive sample (an assignment): list it, and
    # every test below runs it in every place.
    assert {"generic-secret", "aws-secret-key", "gcp-service-account-key-id", "bearer-token"} == KEY_CONTEXT_RULES


def _plain(key: str, value: str) -> str:
    """What a plain text block holding the member makes of the value."""
    member = member_text(key, value)
    out, _ = sanitize_result({"content": [{"type": "text", "text": member}]}, DEFAULT)
    text = out["content"][0]["text"]
    head = f'"{key}": "'
    assert text.startswith(head) and text.endswith('"'), text
    return str(text[len(head):-1])


def _found(value: Any, key: str, out: list[Any]) -> list[Any]:
    """Every value under ``key`` in ``value`` and in any JSON text it holds, and asserts no key was renamed."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == key:
                out.append(v)
            _found(v, key, out)
    elif isinstance(value, list):
        for v in value:
            _found(v, key, out)
    elif isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            parsed = json.loads(value)
        except ValueError:
            return out
        _found(parsed, key, out)
    return out


def _nested(key: str, value: str) -> Any:
    """The member in an object, in an object in an array, and two levels down under other keys (upper case:
    no generated key can collide with them)."""
    return {key: value, "ROWS": [{"ID": 1, key: value}, [{key: value}]], "DETAIL": {"INNER": {key: value}}}


Place = Callable[[str, str], Any]
# Places a walk reaches without redacting credential keys by name: the rule pack alone decides.
PLACES: dict[str, Place] = {
    "structured": lambda k, v: sanitize_result({"content": [], "structuredContent": _nested(k, v)}, DEFAULT)[0],
    "json-text": lambda k, v: sanitize_result(
        {"content": [{"type": "text", "text": json.dumps(_nested(k, v))}]}, DEFAULT)[0],
    "json-text-indented": lambda k, v: sanitize_result(
        {"content": [{"type": "text", "text": json.dumps(_nested(k, v), indent=2)}]}, DEFAULT)[0],
    "structured-mirror": lambda k, v: sanitize_result(
        {"content": [{"type": "text", "text": json.dumps(_nested(k, v))}], "structuredContent": _nested(k, v)},
        DEFAULT)[0],
    "resource-json": lambda k, v: sanitize_result(
        {"content": [{"type": "resource", "resource": {"uri": "file:///sa.json", "mimeType": "application/json",
                                                       "text": json.dumps(_nested(k, v))}}]}, DEFAULT)[0],
    "read-reply-json": lambda k, v: sanitize_reply(
        "resources/read", {"contents": [{"uri": "file:///sa.json", "text": json.dumps(_nested(k, v))}]},
        DEFAULT)[0],
    "block-annotations": lambda k, v: sanitize_result(
        {"content": [{"type": "text", "text": "ok", "annotations": _nested(k, v)}]}, DEFAULT)[0],
    "result-extra": lambda k, v: sanitize_result({"content": [], "extra": _nested(k, v)}, DEFAULT)[0],
}
# Places whose walk also redacts credential keys by name (``by_key``): there such a key's value goes wholesale.
BY_KEY_PLACES: dict[str, Place] = {
    "result-meta": lambda k, v: sanitize_result({"content": [], "_meta": _nested(k, v)}, DEFAULT)[0],
    "block-meta": lambda k, v: sanitize_result(
        {"content": [{"type": "text", "text": "ok", "_meta": _nested(k, v)}]}, DEFAULT)[0],
    "error-data": lambda k, v: sanitize_error({"code": -32000, "message": "m", "data": _nested(k, v)}, DEFAULT)[0],
    "notification-data": lambda k, v: sanitize_notification(
        "notifications/message", {"level": "info", "data": _nested(k, v)}, DEFAULT)[0],
    "notification-params": lambda k, v: sanitize_notification("notifications/custom", _nested(k, v), DEFAULT)[0],
    "tool-definition": lambda k, v: sanitize_tool_definition(
        {"name": "t", "description": "d", "annotations": _nested(k, v),
         "inputSchema": {"type": "object", "x-vendor": _nested(k, v)}}, DEFAULT).definition,
}
ALL_PLACES = {**PLACES, **BY_KEY_PLACES}


def _expected(place: str, key: str, value: str) -> str:
    if place in BY_KEY_PLACES and secret_key(key):
        return "[REDACTED:key-name]"
    return _plain(key, value)


@pytest.mark.parametrize("place", sorted(ALL_PLACES))
@pytest.mark.parametrize(("rule", "key", "value"), KEYED, ids=[f"{r}-{k}" for r, k, _ in KEYED])
def test_member_value_is_redacted_as_in_plain_text(place: str, rule: str, key: str, value: str) -> None:
    expected = _expected(place, key, value)
    if rule in KEY_CONTEXT_RULES:
        assert expected != value  # the reference itself redacts: the comparison below can fail
    found = _found(ALL_PLACES[place](key, value), key, [])
    assert len(found) >= 4, found
    assert found == [expected] * len(found)


@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize(("key", "value", "expected"), [
    ("password", "Xk9mQ2vL8pR4tZ7w", "[REDACTED:generic-secret]"),
    ("private_key_id", "0123456789abcdef0123456789abcdef01234567", "[REDACTED:gcp-service-account-key-id]"),
    ("aws_secret_access_key", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "[REDACTED:aws-secret-key]"),
    ("SecretAccessKey", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "[REDACTED:aws-secret-key]"),
    ("client_secret", "8f3kL0pQz7Xw2vB9nM4c", "[REDACTED:generic-secret]"),
    # Only the span the rule redacts goes: the rest of the value stays readable.
    ("api_key", "Xk9mQ2vL8pR4tZ7w (rotated)", "[REDACTED:generic-secret] (rotated)"),
    # A specific rule still wins over the generic one, as in plain text.
    ("token", "ghp_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1", "[REDACTED:github-token]"),
])
def test_reported_leaks_are_closed(place: str, key: str, value: str, expected: str) -> None:
    found = _found(PLACES[place](key, value), key, [])
    assert len(found) >= 4 and all(f == expected for f in found), found


def test_counts_name_the_rule() -> None:
    _, report = sanitize_result({"content": [], "structuredContent": {"password": "Xk9mQ2vL8pR4tZ7w"}}, DEFAULT)
    assert report.counts == {"secret:generic-secret": 1}


@pytest.mark.parametrize("place", sorted(ALL_PLACES))
@pytest.mark.parametrize("key", ["note", "commit", "url", "remark"])
@pytest.mark.parametrize("value", NEGATIVE)
def test_false_positive_corpus_stays(place: str, key: str, value: str) -> None:
    assert _plain(key, value) == value
    found = _found(ALL_PLACES[place](key, value), key, [])
    assert len(found) >= 4 and all(f == value for f in found), found


@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("key", ["token", "password", "aws_secret_access_key", "private_key_id"])
@pytest.mark.parametrize("value", NEGATIVE)
def test_false_positive_corpus_under_credential_names_is_judged_as_in_text(place: str, key: str,
                                                                          value: str) -> None:
    # Under a credential name, ``generic-secret`` takes any 10+ characters of enough entropy, in text as here
    # (``"token": "git@github.com:org/repo.git"`` is redacted in a plain block too): the same answer, no other.
    found = _found(PLACES[place](key, value), key, [])
    assert len(found) >= 4 and all(f == _plain(key, value) for f in found), found


@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize(("key", "value"), [
    ("token", "page-2-of-10"),
    ("token", "abcabcabcabcabc"),
    ("nextPageToken", "CAUQAA"),
    ("pageToken", "eeeeeeeeeeeeffff"),
    ("password", "hunter2hunter2"),
    ("password", "********"),
    ("password_hint", "your pet's name"),
    ("secret", "see the vault"),
    ("api_key", "none"),
])
def test_low_entropy_values_under_credential_names_stay(place: str, key: str, value: str) -> None:
    # Tool output is not redacted by key name (a pagination token is not a secret): min_entropy decides.
    found = _found(PLACES[place](key, value), key, [])
    assert found and all(f == value for f in found), found


@pytest.mark.parametrize("place", sorted(ALL_PLACES))
def test_keys_are_never_rewritten(place: str) -> None:
    # A key that is itself the start of a rule's match (the name in generic-secret, "private_key_id") is kept.
    for _, key, value in KEYED:
        out = ALL_PLACES[place](key, value)
        assert len(_found(out, key, [])) >= 4, (place, key)


def test_array_items_have_no_key() -> None:
    # Only a member has a key: the same text as an array item is matched alone.
    sc = {"password": ["Xk9mQ2vL8pR4tZ7w"]}
    out, _ = sanitize_result({"content": [], "structuredContent": sc}, DEFAULT)
    assert out["structuredContent"] == sc


def test_a_match_that_takes_the_key_along_redacts_only_the_value() -> None:
    # With no ``secret`` group the whole match is the secret; in parsed JSON its part in the value goes and the
    # key stays. Judged on the whole match, as in text: a value the rule rejects there stays.
    policy = SanitizeConfig.from_mapping({"secrets": {"extra_rules": [
        {"id": "pin", "pattern": r'"user_pin"\s*:\s*"[0-9]{6}"', "min_entropy": 3.5}]}}).default
    text, _ = sanitize_result({"content": [{"type": "text", "text": '"user_pin": "493817"'}]}, policy)
    assert text["content"][0]["text"] == "[REDACTED:pin]"
    out, report = sanitize_result({"content": [], "structuredContent": {"user_pin": "493817"}}, policy)
    assert out["structuredContent"] == {"user_pin": "[REDACTED:pin]"}
    assert report.counts == {"secret:pin": 1}
    out, _ = sanitize_result({"content": [], "structuredContent": {"user_pin": "000000"}}, policy)
    assert out["structuredContent"] == {"user_pin": "000000"}


def test_a_match_wholly_in_the_key_is_left_to_the_key_pass() -> None:
    # Keys are matched on their own, as before; the member pass never rewrites one (the pattern below matches
    # the quoted key only in the member).
    policy = SanitizeConfig.from_mapping(
        {"secrets": {"extra_rules": [{"id": "quoted", "pattern": r'"corp-[a-z]+-host"'}]}}).default
    sc = {"note": {"corp-db-host": "ok"}}
    out, report = sanitize_result({"content": [], "structuredContent": sc}, policy)
    assert out["structuredContent"] == sc
    assert not report.counts


def test_admin_rule_of_the_same_shape() -> None:
    policy = SanitizeConfig.from_mapping({"secrets": {"extra_rules": [
        {"id": "vault-lease", "pattern": r'"vault_lease"\s*:\s*"(?P<secret>hvs\.[A-Za-z0-9]{8,})"'}]}}).default
    sc = {"auth": {"vault_lease": "hvs.CAESIJ3x", "lease": "hvs.CAESIJ3x"}}
    out, report = sanitize_result({"content": [{"type": "text", "text": json.dumps(sc)}], "structuredContent": sc},
                                  policy)
    assert out["structuredContent"] == {"auth": {"vault_lease": "[REDACTED:vault-lease]", "lease": "hvs.CAESIJ3x"}}
    assert json.loads(out["content"][0]["text"]) == out["structuredContent"]
    assert report.counts["secret:vault-lease"] == 1  # the mirror is written from structuredContent


def test_anchored_admin_rule_still_matches_the_value_alone() -> None:
    policy = SanitizeConfig.from_mapping(
        {"secrets": {"extra_rules": [{"id": "whole", "pattern": r"^[A-Z]{4}-[0-9]{6}$"}]}}).default
    out, _ = sanitize_result({"content": [], "structuredContent": {"code": "ABCD-123456"}}, policy)
    assert out["structuredContent"] == {"code": "[REDACTED:whole]"}


def test_allow_lists_apply_to_member_hits() -> None:
    policy = SanitizeConfig.from_mapping({"secrets": {"allow_values": ["Xk9mQ2vL8pR4tZ7w"]}}).default
    sc = {"password": "Xk9mQ2vL8pR4tZ7w"}
    assert sanitize_result({"content": [], "structuredContent": sc}, policy)[0]["structuredContent"] == sc


def test_hidden_characters_in_the_key_do_not_hide_the_member() -> None:
    sc = {"pass\u200bword": "Xk9mQ2vL8pR4tZ7w", "private_key\u2060_id": "0123456789abcdef0123456789abcdef01234567"}
    out, _ = sanitize_result({"content": [], "structuredContent": sc}, DEFAULT)
    assert out["structuredContent"] == {"password": "[REDACTED:generic-secret]",
                                        "private_key_id": "[REDACTED:gcp-service-account-key-id]"}


# -- the prescan -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rule", "key", "value"), [s for s in KEYED if s[0] in KEY_CONTEXT_RULES])
def test_prescan_sees_members(rule: str, key: str, value: str) -> None:
    sanitizer = StringSanitizer(DEFAULT)
    sanitizer.prescan({"rows": [{"id": 1, key: value}]})
    assert sanitizer.patterns


def test_prescan_still_rules_out_a_clean_tree() -> None:
    # The common case keeps its shortcut: members of ordinary output match no rule.
    rows = [{"id": i, "name": f"item-{i}", "owner": "build", "token": "page-2", "tags": ["a", "b"]} for i in range(50)]
    sanitizer = StringSanitizer(DEFAULT)
    sanitizer.prescan({"rows": rows, "nextPageToken": "CAUQAA"})
    assert not sanitizer.patterns


_KEYS = st.one_of(st.sampled_from(["password", "token", "client_secret", "aws_secret_access_key",
                                   "SecretAccessKey", "private_key_id", "api_key", "DB_PASSWORD", "note",
                                   "nextPageToken", "authorization", "x"]),
                  st.text(alphabet="abcdeiklnoprstuwy_-.AKPST", min_size=1, max_size=24))
_SECRETS = [value for _, _, value in KEYED] + ["Xk9mQ2vL8pR4tZ7w", "0123456789abcdef0123456789abcdef01234567"]
_VALUES = st.one_of(
    st.sampled_from(_SECRETS),
    st.builds(lambda a, s, b: a + s + b, st.text(alphabet=" =:\"'abcXYZ019_-/+", max_size=8),
              st.sampled_from(_SECRETS), st.text(alphabet=" =:\"'abcXYZ019_-/+", max_size=8)),
    st.text(alphabet="abcdefXYZ0123456789/+=_-:\" '", min_size=1, max_size=60),
)


# Resource text is plain text (JSON-escaped there, so not the member's own text): the other places parse.
PARSED = sorted(set(PLACES) - {"resource-json", "read-reply-json"})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=_KEYS, value=_VALUES, place=st.sampled_from(PARSED))
def test_structured_output_never_reveals_what_plain_text_redacts(key: str, value: str, place: str) -> None:
    plain = _plain(key, value)
    found = _found(PLACES[place](key, value), key, [])
    assert found
    # The pack has no rule anchored at a value's edges, so the value alone finds nothing the member misses.
    assert all(f == plain for f in found), (plain, found)


def _hide(text: str, at: int, char: str) -> str:
    at %= len(text) + 1
    return text[:at] + char + text[at:]


# Keys and values, some split by a character cleaning removes (the prescan then joins the cleaned strings).
_HIDDEN = st.sampled_from(["", "\u200b", "\u2060", "\x1b[0m", "\ufeff"])
_HIDDEN_KEYS = st.builds(_hide, _KEYS, st.integers(0, 30), _HIDDEN)
_HIDDEN_VALUES = st.builds(_hide, _VALUES, st.integers(0, 80), _HIDDEN)


def test_members_text_holds_each_member() -> None:
    flat = ["password", "Xk9mQ2vL8pR4tZ7w", "a", "", "", "b"]
    joined = members_text(flat)
    for key, value in zip(flat[::2], flat[1::2], strict=True):
        assert member_text(key, value) in joined


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(members=st.lists(st.tuples(_HIDDEN_KEYS, _HIDDEN_VALUES), min_size=1, max_size=6),
       noise=st.lists(st.sampled_from(["ok", "item-1", "\u200b", "build"]), max_size=4))
def test_prescan_never_skips_a_member_the_passes_redact(members: list[tuple[str, str]], noise: list[str]) -> None:
    tree = {"rows": [{k: v} for k, v in members], "notes": noise, **{f"m{i}": {k: v} for i, (k, v) in
                                                                       enumerate(members)}}
    with_prescan = Sanitizer(DEFAULT).json_tree(tree)
    without = Sanitizer(DEFAULT).json_value(tree)  # no prescan: every string goes through the passes
    assert with_prescan == without
