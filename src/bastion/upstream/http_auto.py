"""A Streamable HTTP upstream of either era: probe once, remember the answer, then act as that era's transport.

The probe is a modern ``server/discover`` POST (see ``ModernHttpUpstream.detect``); a server that answers it as a
2026-07-28 server is served statelessly, anything else falls back to the ``initialize`` handshake. The verdict
is a property of the server, so it is kept while this upstream is connected: a session re-initialized after an
outage skips the probe. ``close`` forgets it, so the next ``start`` (the pool's retry after a failed connect) probes
again, as a new upstream would: the server answering then may be another build. A pinned ``era`` skips the probe
altogether.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from bastion.errors import UpstreamUnavailable
from bastion.upstream.base import EraSetting, NotificationHandler, RelatedMessageHandler, UpstreamEra, UpstreamInfo
from bastion.upstream.bodies import DEFAULT_MAX_MESSAGE_BYTES
from bastion.upstream.connections import H1Pool
from bastion.upstream.http import HttpUpstream
from bastion.upstream.http_modern import ModernHttpUpstream
from bastion.upstream.session import DEFAULT_SERVER_REQUESTS, ServerRequests, StrayHandler
from bastion.upstream.supervisor import StateListener

__all__ = ["AutoHttpUpstream"]


class AutoHttpUpstream:
    def __init__(self, name: str, url: str, headers: Mapping[str, str], client: httpx.AsyncClient, *,
                 era: EraSetting = "auto", init_timeout: float = 30.0, listen: bool = True,
                 backoff_initial: float = 0.5, backoff_max: float = 30.0, fast: H1Pool | None = None,
                 on_stray: StrayHandler | None = None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 server_requests: ServerRequests = DEFAULT_SERVER_REQUESTS) -> None:
        """``fast``: a keep-alive pool for this upstream's POSTs (see ``connections``); this upstream owns it,
        closes it in ``close`` and reopens it in ``start``. Without one, every request goes through ``client``.
        ``max_message_bytes``: the most one message (a body, an SSE event) may take once decoded; more makes the
        request fail as unavailable."""
        self.name = name
        self._fast = fast
        self._modern = ModernHttpUpstream(name, url, headers, client, init_timeout=init_timeout, listen=listen,
                                          backoff_initial=backoff_initial, backoff_max=backoff_max, fast=fast,
                                          on_stray=on_stray, max_message_bytes=max_message_bytes,
                                          server_requests=server_requests)
        self._handshake = HttpUpstream(name, url, headers, client, init_timeout=init_timeout, listen=listen,
                                    backoff_initial=backoff_initial, backoff_max=backoff_max, fast=fast,
                                    on_stray=on_stray, max_message_bytes=max_message_bytes,
                                    server_requests=server_requests)
        self._pinned: UpstreamEra | None = None if era == "auto" else era
        self._era = self._pinned
        self._active: ModernHttpUpstream | HttpUpstream | None = None

    @property
    def era(self) -> UpstreamEra | None:
        """The remembered era, ``None`` until the first probe (and again after ``close``)."""
        return self._era

    @property
    def info(self) -> UpstreamInfo | None:
        return self._active.info if self._active is not None else None

    async def start(self, on_notification: NotificationHandler) -> UpstreamInfo:
        if self._fast is not None:
            self._fast.reopen()  # closed by an earlier ``close``: the pool retries a failed start on this object
        if self._era is None:
            self._era = "modern" if await self._modern.detect() == "modern" else "legacy"
        active: ModernHttpUpstream | HttpUpstream = self._modern if self._era == "modern" else self._handshake
        info = await active.start(on_notification)
        self._active = active
        return info

    def watch(self, listener: StateListener) -> None:
        """Health signals of the active transport (the handshake era's GET stream; see ``HttpUpstream.watch``)."""
        self._handshake.watch(listener)

    async def request(self, method: str, params: Mapping[str, Any] | None, *, timeout: float,
                      on_message: RelatedMessageHandler | None = None) -> dict[str, Any]:
        if self._active is None:
            raise UpstreamUnavailable(self.name, log_detail="not connected")
        return await self._active.request(method, params, timeout=timeout, on_message=on_message)

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        if self._active is not None:
            await self._active.notify(method, params)

    def restart(self, reason: str) -> bool:
        return self._active.restart(reason) if self._active is not None else False

    async def close(self) -> None:
        self._active = None
        self._era = self._pinned
        await self._modern.close()
        await self._handshake.close()
        if self._fast is not None:
            await self._fast.aclose()
