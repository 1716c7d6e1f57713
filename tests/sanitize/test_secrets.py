from __future__ import annotations

import base64
import uuid

import pytest

from bastion.errors import ConfigError
from bastion.sanitize.secrets import Redactor, SecretsPolicy, rule_pack, shannon_entropy

REDACTOR = Redactor.from_policy(SecretsPolicy())

# Format-valid fakes, one or more per rule: (rule id, text, expected output).
POSITIVE: list[tuple[str, str, str]] = [
    ("private-key", "k=-----BEGIN RSA PRIVATE KEY-----\nMIIEow==\n-----END RSA PRIVATE KEY-----!",
     "k=[REDACTED:private-key]!"),
    ("private-key", '{"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEv\\n-----END PRIVATE KEY-----\\n"}',
     '{"private_key": "[REDACTED:private-key]\\n"}'),
    ("private-key", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaA==\n-----END OPENSSH PRIVATE KEY-----",
     "[REDACTED:private-key]"),
    ("private-key-truncated", "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIIr\nAwEHoUQDQgAE",
     "[REDACTED:private-key-truncated]"),
    ("private-key-truncated", "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nMIIEow\n-----EN",
     "[REDACTED:private-key-truncated]-----EN"),
    ("aws-access-key", "id=AKIAIOSFODNN7EXAMPLE;", "id=[REDACTED:aws-access-key];"),
    ("aws-access-key", "ASIAY34FZKBOKMUTVV7A", "[REDACTED:aws-access-key]"),
    ("aws-secret-key", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
     "aws_secret_access_key = [REDACTED:aws-secret-key]\n"),
    ("aws-secret-key", '"SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"',
     '"SecretAccessKey": "[REDACTED:aws-secret-key]"'),
    ("gcp-service-account-key-id", '"private_key_id": "0123456789abcdef0123456789abcdef01234567"',
     '"private_key_id": "[REDACTED:gcp-service-account-key-id]"'),
    ("google-api-key", "key=AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe&x", "key=[REDACTED:google-api-key]&x"),
    ("google-oauth-client-secret", "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", "[REDACTED:google-oauth-client-secret]"),
    ("google-oauth-token", "ya29.a0AfH6SMBx1y2z3A4B5C6D7E8F9G0", "[REDACTED:google-oauth-token]"),
    ("azure-storage-key", "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=" + "A" * 40 + "b" * 46
     + "==;EndpointSuffix=core.windows.net",
     "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=[REDACTED:azure-storage-key];"
     "EndpointSuffix=core.windows.net"),
    ("azure-shared-access-key", "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;"
     "SharedAccessKey=Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1Kl3Mn5O=",
     "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;"
     "SharedAccessKey=[REDACTED:azure-shared-access-key]"),
    ("azure-sas-signature", "https://a.blob.core.windows.net/c?sv=2022&sig=Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1Kl3Mn5%3D",
     "https://a.blob.core.windows.net/c?sv=2022&sig=[REDACTED:azure-sas-signature]"),
    ("azure-ad-client-secret", "secret: abc8Q~Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9 ",
     "secret: [REDACTED:azure-ad-client-secret] "),
    ("github-token", "ghp_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1", "[REDACTED:github-token]"),
    ("github-token", "gho_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1 ghu_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1 "
     "ghs_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1",
     "[REDACTED:github-token] [REDACTED:github-token] [REDACTED:github-token]"),
    ("github-fine-grained-pat", "github_pat_" + "11ABCDEFG0" + "x" * 72, "[REDACTED:github-fine-grained-pat]"),
    ("gitlab-token", "glpat-Zx9Kq2Lm4Np6Rs8Tv0Wy", "[REDACTED:gitlab-token]"),
    ("slack-token", "xoxb-2048-4096-Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8 xoxp-1-2-3-abcdef", "[REDACTED:slack-token] "
     "[REDACTED:slack-token]"),
    ("slack-webhook", "https://hooks.slack.com/services/T0000/B0000/Zx9Kq2Lm4Np6Rs8Tv0Wy",
     "https://hooks.slack.com/[REDACTED:slack-webhook]"),
    ("stripe-key", "sk_live_51HqLyjWDarjtT1zdp7dc3Bx9 rk_live_51HqLyjWDarjtT1zdp7dc3Bx9",
     "[REDACTED:stripe-key] [REDACTED:stripe-key]"),
    ("anthropic-api-key", "sk-ant-api03-Q1w2E3r4T5y6U7i8O9p0A1s2D3f4G5h6J7k8L9z0X1c2V3b4N5m6",
     "[REDACTED:anthropic-api-key]"),
    ("openai-api-key", "sk-proj-Q1w2E3r4T5y6U7i8O9p0A1s2D3f4G5h6", "[REDACTED:openai-api-key]"),
    ("openai-api-key", "sk-" + "Q1w2E3r4T5y6U7i8O9p0" + "T3BlbkFJ" + "A1s2D3f4G5h6J7k8L9z0",
     "[REDACTED:openai-api-key]"),
    ("huggingface-token", "hf_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij", "[REDACTED:huggingface-token]"),
    ("npm-token", "//registry.npmjs.org/:_authToken=npm_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1",
     "//registry.npmjs.org/:_authToken=[REDACTED:npm-token]"),
    ("jwt", "Bearer-less eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0 x",
     "Bearer-less [REDACTED:jwt] x"),
    ("bearer-token", "Authorization: Bearer abcDEF123456ghiJKL789", "Authorization: Bearer [REDACTED:bearer-token]"),
    ("bearer-token", '{"Authorization": "Bearer abcDEF123456ghiJKL789"}',
     '{"Authorization": "Bearer [REDACTED:bearer-token]"}'),
    ("url-credentials", "postgres://app:S3cr3tPassw0rd@db.internal:5432/app", "postgres://app:[REDACTED:url-credentials]@"
     "db.internal:5432/app"),
    ("generic-secret", 'DB_PASSWORD="Xk9mQ2vL8pR4tZ7w"', 'DB_PASSWORD="[REDACTED:generic-secret]"'),
    ("generic-secret", "client_secret: 8f3kL0pQz7Xw2vB9nM4c", "client_secret: [REDACTED:generic-secret]"),
]

# Text that must come out unchanged.
NEGATIVE: list[str] = [
    "commit 3f2a9c1e5b7d8f0a1c2e3b4d5f6a7b8c9d0e1f2a (HEAD -> main)",
    f"request id {uuid.UUID(int=0x123E4567E89B12D3A456426614174000)}",
    "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 8).decode(),
    "The quick brown fox jumps over the lazy dog. Passwords should be long; tokens expire.",
    "def connect(password: str, token: str | None = None) -> None:\n    return None\n",
    "password = hunter2hunter2",  # low entropy: honest limit, documented
    "password: ********",
    "AKIA is a prefix; AKIAshort is not a key",
    "https://example.com:8443/path@user",
    "git@github.com:org/repo.git",
    "sk-learn is a library; sk-ant- alone is not a key",
    "eyJhbGciOiJIUzI1NiJ9 alone is only a header",
    "token_count: 1234567890123",
    "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----",
    "[REDACTED:github-token] is already redacted",
]


def test_every_rule_has_a_positive_case() -> None:
    assert {r.id for r in rule_pack()} == {rule_id for rule_id, _, _ in POSITIVE}


@pytest.mark.parametrize(("rule_id", "text", "expected"), POSITIVE, ids=[f"{p[0]}-{i}" for i, p in enumerate(POSITIVE)])
def test_rule_redacts(rule_id: str, text: str, expected: str) -> None:
    out, counts = REDACTOR.redact(text)
    assert out == expected
    assert set(counts) == {f"secret:{rule_id}"}


@pytest.mark.parametrize("text", NEGATIVE)
def test_false_positive_controls(text: str) -> None:
    out, counts = REDACTOR.redact(text)
    assert out == text
    assert not counts


def test_specific_rule_wins_over_generic_assignment() -> None:
    out, _ = REDACTOR.redact("token: ghp_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1")
    assert out == "token: [REDACTED:github-token]"


def test_secret_with_non_ascii_around_it() -> None:
    out, counts = REDACTOR.redact("clé → ghp_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1 ✓")
    assert out == "clé → [REDACTED:github-token] ✓"
    assert counts == {"secret:github-token": 1}


def test_admin_rules_allow_list_and_disable() -> None:
    policy = SecretsPolicy.from_mapping({
        "extra_rules": [{"id": "acme-key", "pattern": r"\bacme_[0-9a-f]{16}\b", "description": "ACME API key"}],
        "allow": [r"AKIA[A-Z0-9]*EXAMPLE"],
        "allow_values": ["ghp_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1"],
        "disable": ["jwt"],
    })
    redactor = Redactor.from_policy(policy)
    text = ("acme_0123456789abcdef AKIAIOSFODNN7EXAMPLE ghp_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1 "
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig AKIAY34FZKBOKMUTVV7A")
    out, counts = redactor.redact(text)
    assert out == ("[REDACTED:acme-key] AKIAIOSFODNN7EXAMPLE ghp_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij1 "
                   "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig [REDACTED:aws-access-key]")
    assert counts == {"secret:acme-key": 1, "secret:aws-access-key": 1}


def test_rule_that_re2_cannot_compile_falls_back_to_re() -> None:
    policy = SecretsPolicy.from_mapping({"extra_rules": [
        {"id": "after-pin", "pattern": r"(?<=PIN=)\d{6}", "description": "lookbehind needs re"}]})
    redactor = Redactor.from_policy(policy)
    assert redactor.fallback_count == 1
    assert redactor.redact("PIN=123456 ok") == ("PIN=[REDACTED:after-pin] ok", {"secret:after-pin": 1})


def test_disabled_secrets_redact_nothing() -> None:
    redactor = Redactor.from_policy(SecretsPolicy.from_mapping({"enabled": False}))
    assert redactor.redact("AKIAIOSFODNN7EXAMPLE")[0] == "AKIAIOSFODNN7EXAMPLE"


@pytest.mark.parametrize(("section", "path"), [
    ({"extra": []}, "sanitize.secrets"),
    ({"extra_rules": [{"id": "x", "pattern": "("}]}, "sanitize.secrets.extra_rules[0].pattern"),
    ({"extra_rules": [{"id": "x y", "pattern": "a"}]}, "sanitize.secrets.extra_rules[0].id"),
    ({"extra_rules": [{"id": "jwt", "pattern": "a"}]}, "sanitize.secrets.extra_rules"),
    ({"extra_rules": [{"id": "x", "pattern": "a", "min_entropy": 9}]}, "sanitize.secrets.extra_rules[0].min_entropy"),
    ({"disable": ["no-such-rule"]}, "sanitize.secrets.disable"),
    ({"allow": "AKIA"}, "sanitize.secrets.allow"),
    ({"enabled": "yes"}, "sanitize.secrets.enabled"),
])
def test_bad_secrets_config(section: dict[str, object], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        SecretsPolicy.from_mapping(section)
    assert info.value.path == path


def test_entropy() -> None:
    assert shannon_entropy("") == 0.0
    assert shannon_entropy("aaaa") == 0.0
    assert shannon_entropy("abcd") == 2.0
