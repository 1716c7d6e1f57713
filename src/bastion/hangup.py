"""SIGHUP, the signal operators and service managers send a daemon to reload (``systemctl reload``, ``kill -HUP``).

Its default action ends the process on the spot: no drain of the calls in flight, no ``session.end`` records, the
audit records still queued lost, and stdio upstreams left to notice on their own. ``bastion serve`` keeps running
instead and reads the policy files at once. The config file is read at start only, so the log line says that a
change to it needs a restart.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable

__all__ = ["ignore_until_started", "install"]


def ignore_until_started() -> None:
    """From process start until ``install``: a handler that does nothing, not ``SIG_IGN``, which child processes
    would inherit across ``exec`` (a handler is reset to the default there)."""
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda *_: None)


def install(on_hangup: Callable[[], None]) -> Callable[[], None]:
    """Run ``on_hangup`` in the running event loop at each SIGHUP; returns what removes it again. Nothing is
    installed off the main thread (an app run in-process, as tests do) or where the platform has no SIGHUP."""
    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, on_hangup)

    def remove() -> None:
        loop.remove_signal_handler(signal.SIGHUP)
        ignore_until_started()  # the last moments of shutdown: still no reason to die without flushing

    return remove
