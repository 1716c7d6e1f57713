"""Sessions of the handshake-era revisions (up to 2025-11-25): what ``initialize`` negotiated, bound to its principal.

Below the front door (``bastion.server``) and the gateway, which both read them; imports nothing of either.
``store`` holds the durable part and its in-memory store, ``redis_store`` the shared one, ``fallback`` and
``cache`` wrap it (a Redis outage; no round trip per request), ``sweep`` notices expiry, ``live`` is this
replica's runtime state per session.
"""
