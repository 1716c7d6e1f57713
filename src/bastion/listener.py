"""The listening socket of a bastion server, bound before anything else starts.

Shared by the gateway's own listener (``bastion serve``) and the admin console's (``admin.server``): both must
fail on a port in use at start-up, before upstreams are spawned or anything is announced.
"""

from __future__ import annotations

import socket

__all__ = ["bind_listener"]


def bind_listener(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything else starts. Raises ``OSError`` (port in use, address not
    available, permission denied) while nothing has been spawned or announced yet."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        # As uvicorn does: a restarted gateway may bind while the old connections sit in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
