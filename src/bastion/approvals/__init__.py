"""Human approval of tool calls that an ``effect: approve`` rule holds (issue 17).

``ApprovalService`` is the one object everything else talks to: the pipeline's ``ApprovalGuard`` opens a pending
approval and waits on it; the calling user answers through the client (elicitation), an admin through the admin
HTTP API, the CLI (which calls that API) or the admin console; with Redis, any replica can decide an approval and
the waiting call resumes on its own replica.
"""

from bastion.approvals.config import ApprovalsConfig
from bastion.approvals.model import Channel, PendingApproval, Verdict, VerdictOutcome
from bastion.approvals.service import ApprovalEvent, ApprovalService, ApprovalsFull, NotAnApprover

__all__ = ["ApprovalEvent", "ApprovalService", "ApprovalsConfig", "ApprovalsFull", "Channel", "NotAnApprover",
           "PendingApproval", "Verdict", "VerdictOutcome"]
