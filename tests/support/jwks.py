"""A real JWKS endpoint on loopback and real key pairs, for authentication tests at every level."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm


@dataclass
class KeyPair:
    kid: str
    private: Any
    public: Any
    jwk: dict[str, Any]


@dataclass
class JwksServer:
    """Serves ``keys`` at ``url``; counts requests in ``hits``."""

    keys: list[dict[str, Any]] = field(default_factory=list)
    hits: int = 0
    httpd: ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self.httpd is not None
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/jwks.json"

    def start(self) -> JwksServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.hits += 1
                body = json.dumps({"keys": owner.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.httpd is not None and self.thread is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.thread.join(timeout=10)
            self.thread = None


def jwk_of(public: Any, kid: str, algorithm: type[RSAAlgorithm] | type[ECAlgorithm]) -> dict[str, Any]:
    jwk: dict[str, Any] = json.loads(algorithm.to_jwk(public))
    jwk.update(kid=kid, use="sig")
    return jwk


def rsa_pair(kid: str) -> KeyPair:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return KeyPair(kid, private, private.public_key(), jwk_of(private.public_key(), kid, RSAAlgorithm))


def ec_pair(kid: str) -> KeyPair:
    private = ec.generate_private_key(ec.SECP256R1())
    return KeyPair(kid, private, private.public_key(), jwk_of(private.public_key(), kid, ECAlgorithm))
