"""Request ids bastion sends to one upstream connection: never reused, and not guessable from outside.

A response is matched to its request by id alone on transports without a stream per request (stdio,
HTTP+SSE). If ids were a counter from 0 (as they were), anyone who can make the upstream write a line of their
choosing (a careless server that echoes input to stdout, a tool that relays text into its stream) could forge an
answer to another caller's request by guessing its id. So ids are a keyed pseudo-random permutation of a counter:

- the counter makes them unique: a permutation never maps two counter values to the same id, so an id is not
  reused for 2**52 requests on one connection, and a late answer can never land on a newer request;
- the key (32 random bytes per connection, from the OS CSPRNG) makes them unpredictable: knowing earlier ids says
  nothing practical about the next ones, and a new connection starts from a fresh key.

The permutation is a balanced four-round Feistel network over 52 bits (two 26-bit halves, keyed BLAKE2b as
round function).
Ids stay below 2**53, so every JSON implementation (JavaScript numbers included) round-trips them exactly; they
are integers because a few servers mishandle string ids, and the id doubles as the progress token the upstream
sees (MCP allows integer tokens everywhere).
"""

from __future__ import annotations

import hashlib
import secrets

__all__ = ["ID_BITS", "RequestIds"]

ID_BITS = 52
_HALF = ID_BITS // 2
_MASK = (1 << _HALF) - 1
# Four rounds with a pseudo-random round function make a strong pseudo-random permutation (Luby-Rackoff).
_ROUNDS = 4


class RequestIds:
    """Ids for one upstream connection. ``next()`` is O(1): four BLAKE2b digests of 4 bytes each, from round
    hashers keyed once per connection (copying a keyed state is cheaper than keying one per digest)."""

    __slots__ = ("_counter", "_rounds")

    def __init__(self, key: bytes | None = None) -> None:
        key = key if key is not None else secrets.token_bytes(32)
        self._rounds = [hashlib.blake2b(key=key, digest_size=4, person=bytes((n,))) for n in range(_ROUNDS)]
        # A random start as well, so the first ids of two connections with equal keys (tests) still differ.
        self._counter = secrets.randbits(ID_BITS - 8) if key is None else 0

    def next(self) -> int:
        while True:
            self._counter = (self._counter + 1) & ((1 << ID_BITS) - 1)
            rid = self.permute(self._counter)
            if rid:  # 0 is a valid id, but falsy in too many servers' checks
                return rid

    def permute(self, value: int) -> int:
        left, right = value >> _HALF, value & _MASK
        for base in self._rounds:
            round_fn = base.copy()
            round_fn.update(right.to_bytes(4, "big"))
            left, right = right, left ^ (int.from_bytes(round_fn.digest(), "big") & _MASK)
        return (left << _HALF) | right
