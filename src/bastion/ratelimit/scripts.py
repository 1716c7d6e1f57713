"""The Lua scripts, loaded once per Redis and called by SHA.

EVALSHA sends 40 bytes instead of the script. A Redis that restarted (or was flushed) forgets its scripts and
answers NOSCRIPT; the script is then loaded again and the call retried once.

A script runs on any ``ScriptClient``: redis-py's client (Sentinel, Cluster, a URL with options) or the lean one of
``bastion.resp`` (a single server, the default), which raises the same ``NoScriptError``.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any, Protocol

from redis.exceptions import NoScriptError


class ScriptClient(Protocol):
    """What running a script needs of a Redis client; ``redis.asyncio.Redis`` and ``bastion.resp.LeanRedis``."""

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: str | int) -> Any: ...

    async def script_load(self, script: str) -> Any: ...


class Script:
    def __init__(self, name: str) -> None:
        self.name = name
        self.source = resources.files("bastion.ratelimit").joinpath(name).read_text(encoding="utf-8")
        self.sha = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()

    async def load(self, client: ScriptClient) -> None:
        await client.script_load(self.source)

    async def __call__(self, client: ScriptClient, keys: list[str], args: list[str | int]) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self.load(client)
            return await client.evalsha(self.sha, len(keys), *keys, *args)


GCRA = "gcra.lua"
LEASE_ACQUIRE = "lease_acquire.lua"
LEASE_RENEW = "lease_renew.lua"
LEASE_RELEASE = "lease_release.lua"
