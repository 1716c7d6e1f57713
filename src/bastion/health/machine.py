"""The health of one upstream as a pure state machine: no I/O, no clock of its own, every input carries ``at``.

States:

- ``up``: connected, and the last call or probe was answered.
- ``degraded``: connected, but the last call or probe failed; fewer than ``failures_to_down`` in a row so far.
  Calls still go through (the failure may have been one slow tool), and the monitor probes at once to confirm.
- ``down``: not connected, or ``failures_to_down`` consecutive transport failures. Calls fail fast with -31002;
  after ``hide_after`` its tools leave ``tools/list``.
- ``restarting``: the transport lost its connection and is re-establishing it on its own (a stdio child being
  respawned, an HTTP+SSE stream re-opened). Failures seen meanwhile are expected and change nothing; only the
  transport's own "connected" ends it.

An answer of any kind (a result, a JSON-RPC error, a tool's ``isError``) is a success: the upstream is there.
Transport failures (unreachable, died, refused, no answer in time) are failures. ``since`` moves only when the
state changes, so "down since 12:03" stays true while the reasons of later failures are updated.

An answer counts only if its request was sent after the latest failure (``sent_at``): an upstream shutting down
finishes the calls it had accepted while it already refuses new ones, and the late answer to a call sent before
the failure says nothing about now. It must not bring a ``down`` upstream back ``up`` (and refresh its lists,
and report it ready) while nothing new can reach it; the next probe, sent after the failure, decides.

Likewise a failure counts only if its request was sent after the transport last (re)connected (``connected_at``): a
request still out on a connection the transport has since replaced (a frozen HTTP session left for a new one, whose
stuck requests time out after the new session answered) says nothing about the new connection.

A connection replaced because it stopped answering (``replaced``: the pool restarted a ``down`` upstream) is not
``up`` again on its handshake alone: a server that freezes every session it opens, or a child that hangs right
after its handshake, answers ``initialize`` and nothing else, and would be reported ``up`` (ready, counted up)
between every two restarts while no call could succeed. Its ``connected`` leaves it ``restarting`` (``on_trial``)
until a request sent on the new connection is answered (``up``) or fails (``down``, which makes the pool restart
it again, the transport's backoff pacing the restarts).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["Health", "HealthState", "connected", "disconnected", "failed", "hidden", "initial", "public_reason",
           "refuses_calls", "restarted", "restarting", "succeeded"]

HealthState = Literal["up", "degraded", "down", "restarting"]


@dataclass(frozen=True, slots=True)
class Health:
    state: HealthState
    reason: str
    since: float  # when the state last changed (the caller's clock)
    failures: int = 0  # consecutive failures
    failed_at: float = -math.inf  # when the latest failure (or loss of the connection) was seen
    connected_at: float = -math.inf  # when the transport last reported itself (re)connected
    replaced: bool = False  # the connection is being replaced because it stopped answering (``restarted``)
    on_trial: bool = False  # reconnected after such a replacement: ``restarting`` until a request on it is judged
    # When it last stopped answering (entered ``down`` or ``restarting`` from an answering state): its tools are
    # hidden ``hide_after`` from then, however often it moves between the two meanwhile.
    unavailable_since: float = -math.inf

    @property
    def answering(self) -> bool:
        """Counts as up for readiness and ``bastion_upstream_up``."""
        return self.state in ("up", "degraded")


def initial(at: float) -> Health:
    return Health("down", "not connected yet", at, unavailable_since=at)


def _to(health: Health, state: HealthState, reason: str, at: float, failures: int,
        failed_at: float | None = None) -> Health:
    since = health.since if state == health.state else at
    unavailable_since = at if health.answering else health.unavailable_since
    return replace(health, state=state, reason=reason, since=since, failures=failures,
                   failed_at=health.failed_at if failed_at is None else failed_at, unavailable_since=unavailable_since)


def succeeded(health: Health, at: float, sent_at: float | None = None) -> Health:
    """An answer arrived at ``at`` to a request sent at ``sent_at`` (None: not known, counts as fresh). An answer
    to a request sent before the latest failure is stale and changes nothing (see the module docstring)."""
    if health.state == "up" and health.failures == 0:
        return health  # the hot path: nothing to allocate
    if sent_at is not None and sent_at < health.failed_at:
        return health
    return replace(_to(health, "up", "answering", at, 0), replaced=False, on_trial=False)


def failed(health: Health, at: float, reason: str, *, failures_to_down: int, soft: bool = False,
           sent_at: float | None = None) -> Health:
    """A call or probe failed at the transport level. ``soft``: a call that timed out, which may be one slow
    tool rather than a sick upstream; it degrades a healthy upstream (so a probe decides) but never counts
    towards ``down``, or a burst of slow calls would make a live upstream refuse everything. ``sent_at``: when
    its request was sent (None: not known, counts); one sent before the latest (re)connection changes nothing."""
    if sent_at is not None and sent_at < health.connected_at:
        return health
    if health.on_trial:
        if soft:
            return health  # one slow tool proves nothing either way: the probes decide
        # The new connection failed as the old one did: down, and the pool replaces it again.
        return replace(_to(health, "down", reason, at, health.failures + 1, at), on_trial=False)
    if health.state == "restarting":
        return replace(health, failures=health.failures + 1, failed_at=at)
    if soft:
        return _to(health, "degraded", reason, at, health.failures, at) if health.state == "up" else health
    failures = health.failures + 1
    if health.state == "down" or failures >= failures_to_down:
        return _to(health, "down", reason, at, failures, at)
    return _to(health, "degraded", reason, at, failures, at)


def connected(health: Health, at: float) -> Health:
    """The transport (re)connected: handshake done, lists fetched or about to be. After a replacement of an
    unresponsive connection, that is not enough: ``restarting`` until a request on it is judged."""
    if health.replaced:
        return replace(_to(health, "restarting", "reconnected, waiting for an answer", at, health.failures),
                       connected_at=at, replaced=False, on_trial=True)
    return replace(_to(health, "up", "connected", at, 0), connected_at=at, on_trial=False)


def restarted(health: Health) -> Health:
    """The pool is replacing the connection because it stopped answering (``down`` while connected)."""
    return replace(health, replaced=True, on_trial=False)


def disconnected(health: Health, at: float, reason: str) -> Health:
    """Connecting failed, or the connection is gone and nobody is re-establishing it on its own."""
    return replace(_to(health, "down", reason, at, health.failures + 1, at), on_trial=False)


def restarting(health: Health, at: float, reason: str) -> Health:
    return _to(health, "restarting", reason, at, health.failures, at)


# The reasons, or leading parts of reasons, that are bastion's own words. A reason is mostly built from the error
# that caused it, and an error's detail can carry what the upstream sent (an HTTP error body, a version string, an
# error message, a URL), which must not reach an unauthenticated reader.
_OWN_REASONS = ("answering", "connected", "not connected yet", "probe failed", "list refresh failed",
                "reconnected, waiting for an answer")
_EXIT_CODE = re.compile(r"; exit code (-?[0-9]{1,4})$")
_STATE_REASONS: dict[HealthState, str] = {"up": "answering", "degraded": "call failed", "down": "unavailable",
                                          "restarting": "restarting"}


def public_reason(health: Health) -> str:
    """The reason as ``/readyz`` publishes it: only bastion's own words (an allowlist: a reason not known to be
    free of upstream text is reduced to its state's word). The whole reason goes to the log and the console."""
    reason = health.reason
    for own in _OWN_REASONS:
        if reason == own or reason.startswith(own + ":"):
            return own
    word = _STATE_REASONS[health.state]
    exited = _EXIT_CODE.search(reason)
    # A stdio child's exit code is the operating system's number, and the first thing an operator asks for.
    return f"{word}: exit code {exited.group(1)}" if exited else word


def refuses_calls(health: Health) -> bool:
    """Calls fail fast instead of waiting on a transport known to be gone. A restarting transport decides on its
    own (it lets a call wait for a reconnect that is already under way)."""
    return health.state == "down"


def hidden(health: Health, now: float, hide_after: float | None) -> bool:
    """Its tools leave the lists once it has been unavailable for the grace period (``None``: never)."""
    return (hide_after is not None and health.state in ("down", "restarting")
            and now - health.unavailable_since >= hide_after)
