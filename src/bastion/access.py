"""Who may see what: the access contract the catalogue's readers share.

Below the gateway, the listing cache (``bastion.visibility``) and the broadcast of upstream notifications, which
all ask the same question; the policy (``bastion.policy.guard.PolicyAccess``) answers it, and ``AllowAll`` does
when no policy is configured. One decision function for lists and calls, so list and call agree.
"""

from __future__ import annotations

from typing import Protocol

from bastion.principal import Principal
from bastion.ratelimit.model import Allowance
from bastion.tool_entry import ToolEntry
from bastion.view import View


class AccessControl(Protocol):
    """What a principal may see. The same decision function that governs calls, so list and call agree."""

    def tool_visible(self, principal: Principal, entry: ToolEntry) -> bool: ...

    def prompt_visible(self, principal: Principal, upstream: str, public_name: str) -> bool: ...

    def resource_visible(self, principal: Principal, upstream: str, uri: str) -> bool: ...

    def prompt_allowance(self, principal: Principal, upstream: str, public_name: str) -> Allowance | None:
        """The limits the allowing rules attach to a request for this prompt; ``None`` when it is not visible."""

    def resource_allowance(self, principal: Principal, upstream: str, uri: str) -> Allowance | None:
        """As ``prompt_allowance``, for a resource URI in its canonical form."""

    @property
    def per_principal(self) -> bool:
        """True when what a caller sees depends on who it is (modern ``cacheScope: private``)."""


class AllowAll:
    """No access policy configured: every authenticated principal sees and may call everything."""

    per_principal = False

    def tool_visible(self, principal: Principal, entry: ToolEntry) -> bool:
        return True

    def prompt_visible(self, principal: Principal, upstream: str, public_name: str) -> bool:
        return True

    def resource_visible(self, principal: Principal, upstream: str, uri: str) -> bool:
        return True

    def prompt_allowance(self, principal: Principal, upstream: str, public_name: str) -> Allowance | None:
        return _NOTHING_ATTACHED

    def resource_allowance(self, principal: Principal, upstream: str, uri: str) -> Allowance | None:
        return _NOTHING_ATTACHED


_NOTHING_ATTACHED = Allowance()


def may_see_upstream(view: View, access: AccessControl, principal: Principal, upstream: str) -> bool:
    """Whether anything of ``upstream`` is visible to ``principal`` in ``view`` (a tool, prompt or resource)."""
    catalogue = view.catalogue
    return any(t.upstream == upstream and t.public_name not in view.quarantined
               and access.tool_visible(principal, t) for t in catalogue.tools) \
        or any(p.upstream == upstream and access.prompt_visible(principal, upstream, p.public_name)
               for p in catalogue.prompts) \
        or any(up == upstream and access.resource_visible(principal, up, str(r.get("uri")))
               for up, r in catalogue.resources)
