"""Real key pairs made for the test run, and a real JWKS endpoint on loopback (see tests/support/jwks.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.jwks import JwksServer, KeyPair, ec_pair, rsa_pair

__all__ = ["JwksServer", "KeyPair"]


@pytest.fixture(scope="session")
def rsa_key() -> KeyPair:
    return rsa_pair("rsa-1")


@pytest.fixture(scope="session")
def rsa_key_2() -> KeyPair:
    return rsa_pair("rsa-2")


@pytest.fixture(scope="session")
def ec_key() -> KeyPair:
    return ec_pair("ec-1")


@pytest.fixture
def jwks_server(rsa_key: KeyPair, ec_key: KeyPair) -> Iterator[JwksServer]:
    server = JwksServer(keys=[rsa_key.jwk, ec_key.jwk]).start()
    yield server
    server.stop()
