"""Tool-definition pinning: trust on first use, quarantine on change, admin approval.

The core wires it as: ``Pinning(open_store(cfg, redis), cfg)``; ``await pinning.reconcile(upstream, tools)`` after
every tools/list refresh of an upstream (``bastion.views.PinTools``), which puts ``outcome.quarantined`` in the
view's quarantine map (enforced for lists and calls by ``bastion.quarantine.QuarantineGuard``) and audits drift.
"""

from bastion.pinning.config import PinningConfig
from bastion.pinning.errors import (
    CandidateMismatch,
    NothingPending,
    PinningError,
    PinNotFound,
    PinStoreCorrupt,
    PinStoreUnavailable,
)
from bastion.pinning.fingerprint import FINGERPRINTED_FIELDS, diff, fingerprint
from bastion.pinning.model import Candidate, Pin, PinEvent, PinnedTool
from bastion.pinning.service import Pinning, PinOutcome
from bastion.pinning.store import FilePinStore, PinStore, RedisPinStore, open_store

__all__ = [
    "FINGERPRINTED_FIELDS",
    "Candidate",
    "CandidateMismatch",
    "FilePinStore",
    "NothingPending",
    "Pin",
    "PinEvent",
    "PinNotFound",
    "PinOutcome",
    "PinStore",
    "PinStoreCorrupt",
    "PinStoreUnavailable",
    "PinnedTool",
    "Pinning",
    "PinningConfig",
    "PinningError",
    "RedisPinStore",
    "diff",
    "fingerprint",
    "open_store",
]
