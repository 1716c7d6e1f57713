"""Bucket keys: ``<limit name>:<scope key>``, the limiter adds its prefix. Pure.

Every component is percent-encoded (``:``, ``,`` and ``=`` included), so a principal called ``a:b`` can never
share a bucket with principal ``a`` calling tool ``b``.
"""

from __future__ import annotations

from urllib.parse import quote

from bastion.ratelimit.model import ConcurrencyScope, Scope


def _enc(value: str) -> str:
    return quote(value, safe="@._-~")


def scope_key(scope: Scope | ConcurrencyScope, *, principal: str, tool: str, upstream: str,
              kind: str = "tool") -> str:
    """``kind`` names what ``tool`` is for ``principal_tool``: a tool, or another request's target
    (``ratelimit.forwarded.Target``); each kind its own field, so a prompt never shares a tool's bucket."""
    if scope == "principal":
        return f"principal={_enc(principal)}"
    if scope == "principal_tool":
        return f"principal={_enc(principal)},{kind}={_enc(tool)}"
    if scope == "upstream":
        return f"upstream={_enc(upstream)}"
    return "global"


def bucket_key(name: str, scope: Scope | ConcurrencyScope, *, principal: str, tool: str, upstream: str,
               kind: str = "tool") -> str:
    return f"{_enc(name)}:{scope_key(scope, principal=principal, tool=tool, upstream=upstream, kind=kind)}"
