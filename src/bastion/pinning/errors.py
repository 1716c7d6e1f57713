"""Pinning's errors. Admin operations raise them; ``reconcile`` turns store failures into quarantine instead."""

from __future__ import annotations

from bastion.errors import BastionError


class PinningError(BastionError):
    """Root of pinning's errors; ``str()`` is a message fit for an admin's terminal."""


class PinStoreUnavailable(PinningError):
    """The pin store cannot be read or written (Redis down or timing out, file not readable or writable)."""


class PinStoreCorrupt(PinStoreUnavailable):
    """The pin store holds data bastion cannot read. Treated like an outage: nothing is trusted from it."""


class PinNotFound(PinningError):
    def __init__(self, upstream: str, tool: str) -> None:
        super().__init__(f"no pin for tool {tool!r} of upstream {upstream!r}")


class NothingPending(PinningError):
    def __init__(self, upstream: str, tool: str) -> None:
        super().__init__(f"tool {tool!r} of upstream {upstream!r} has no pending change")


class CandidateMismatch(PinningError):
    """The pending change is not the one the admin reviewed (the upstream changed it again in between)."""

    def __init__(self, upstream: str, tool: str, expected: str, actual: str) -> None:
        super().__init__(f"the pending change of {upstream}/{tool} is {actual}, not {expected}; review it again")
