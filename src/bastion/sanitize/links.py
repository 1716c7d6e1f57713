"""Which URLs may reach a client as an icon or a link, and which object keys hold a secret by their name. Pure.

Icons and ``websiteUrl`` are fetched or opened by the client, not read by the model: a ``javascript:`` link runs
code, a ``data:`` SVG carries script, and a plain ``http:`` URL can be rewritten on the way. So only ``https:`` and
inline raster images pass; ``http:`` only when the admin allows it (``sanitize.allow_http_links``).
"""

from __future__ import annotations

import re
from functools import lru_cache

_DATA_IMAGE = re.compile(r"data:image/(?:png|jpeg|gif|webp)(?:;[A-Za-z0-9=._+-]{1,64}){0,4},[A-Za-z0-9+/=%._~-]*",
                         re.IGNORECASE)
_HOST = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#\s@]+", re.ASCII)

# Object keys naming a credential: the value is a secret whatever it looks like (``AWS_SECRET_ACCESS_KEY``,
# ``password``, ``apiKey``, ``x-auth-token``...). camelCase is split first, then the last words are matched.
_SECRET_KEY = re.compile(
    r"(?:^|_)(?:password|passwd|passphrase|pwd|secret|secret_key|secret_access_key|client_secret|token|"
    r"access_token|refresh_token|id_token|auth_token|session_token|bearer|api_key|apikey|access_key|"
    r"private_key|authorization|cookie|set_cookie|credential|credentials|connection_string|dsn)$")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[^a-z0-9]+")
# Protocol fields whose names happen to end like a credential's; they are identifiers, never secrets.
PROTOCOL_KEYS = frozenset({"progressToken", "nextCursor", "cursor", "requestId", "requestState"})


def link_allowed(url: str, allow_http: bool = False) -> bool:
    """``https://host…``, ``data:image/(png|jpeg|gif|webp)…``, and ``http://host…`` when allowed; nothing with
    whitespace, control or invisible characters (a link must read as what it opens)."""
    if not url.isascii() or not url.isprintable() or any(c.isspace() for c in url):
        return False
    lower = url[:8].lower()
    if lower.startswith("https://") or (allow_http and lower.startswith("http://")):
        return _HOST.match(url) is not None
    return _DATA_IMAGE.fullmatch(url) is not None


def secret_key(name: str) -> bool:
    """True when an object key names a credential, so its value is redacted whatever it looks like."""
    if len(name) > 128 or name in PROTOCOL_KEYS:
        return False
    return _names_a_secret(name)


# Pure, and the same few hundred keys recur in every definition and result. Only names up to 128 characters reach
# it: the keys are an upstream's, and a cache of longer ones would hold whatever an upstream chose to send.
@lru_cache(maxsize=4096)
def _names_a_secret(name: str) -> bool:
    normal = _SEPARATORS.sub("_", _CAMEL.sub("_", name).lower())
    return _SECRET_KEY.search(normal) is not None
