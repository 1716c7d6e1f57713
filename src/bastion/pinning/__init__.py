"""Tool-definition pinning: trust on first use, quarantine on change, admin approval.

The core wires it as: ``Pinning(open_store(cfg, redis), cfg)``; ``await pinning.reconcile(upstream, tools)`` after
every tools/list refresh of an upstream (the view step ``PinTools``, with ``PinRecheck`` when the store could not
be read), which puts ``outcome.quarantined`` in the view's quarantine map (enforced for lists and calls by the
``QuarantineGuard`` request guard) and audits drift; ``watch_store`` applies approvals made elsewhere.
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
from bastion.pinning.guard import QuarantineGuard
from bastion.pinning.model import Candidate, Pin, PinEvent, PinnedTool
from bastion.pinning.service import Pinning, PinOutcome
from bastion.pinning.store import FilePinStore, PinStore, RedisPinStore, open_store
from bastion.pinning.view_step import PinRecheck, PinTools
from bastion.pinning.watch import PinWatcher, watch_store

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
    "PinRecheck",
    "PinStore",
    "PinStoreCorrupt",
    "PinStoreUnavailable",
    "PinTools",
    "PinWatcher",
    "PinnedTool",
    "Pinning",
    "PinningConfig",
    "PinningError",
    "QuarantineGuard",
    "RedisPinStore",
    "diff",
    "fingerprint",
    "open_store",
    "watch_store",
]
