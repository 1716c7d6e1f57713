"""Bucket keys: ``<limit name>:<scope key>``, the limiter adds its prefix. Pure.

Every component is percent-encoded (``:``, ``,`` and ``=`` included), so a principal called ``a:b`` can never
share a bucket with principal ``a`` calling tool ``b``.
"""

from __future__ import annotations

from urllib.parse import quote

from bastion.ratelimit.model import ConcurrencyScope, Scope


def _enc(value: str) -> str:
    return quote(value, safe="@._-~")


def scope_key(scope: Scope | ConcurrencyScope, *, principal: str, tool: str, upstream: str) -> str:
    if scope == "principal":
        return f"principal={_enc(principal)}"
    if scope == "principal_tool":
        return f"principal={_enc(principal)},tool={_enc(tool)}"
    if scope == "upstream":
        return f"upstream={_enc(upstream)}"
    return "global"


def bucket_key(name: str, scope: Scope | ConcurrencyScope, *, principal: str, tool: str, upstream: str) -> str:
    return f"{_enc(name)}:{scope_key(scope, principal=principal, tool=tool, upstream=upstream)}"
