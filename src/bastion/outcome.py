"""What became of one ``tools/call``: the word its audit record and its span carry.

A module of its own, below everything, because both ends use it: the errors that stop a call say which outcome
they mean (``RequestError.outcome``), and the call model (``bastion.call``) hands it to the audit hook.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["Outcome"]

Outcome = Literal["allowed", "denied", "rate_limited", "invalid_input", "invalid_output", "upstream_error",
                  "timeout", "client_disconnected", "error", "malformed_result"]
