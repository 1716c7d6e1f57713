"""The MCP protocol as bastion speaks it on both sides: constants, wire shapes and the pure rules both share.

bastion is a server to its clients (``bastion.server``) and a client to its upstreams (``bastion.upstream``), in
both eras of the protocol: the session-based revisions (2024-11-05 … 2025-11-25, opened by ``initialize``) and the
stateless 2026-07-28 revision (every request carries its version and client identity in ``_meta``). Both sides
must agree on every version string, ``_meta`` key and method name, so each is defined once, here:

- ``versions``: the revisions of each era, and which one bastion offers.
- ``meta``: the ``io.modelcontextprotocol/*`` keys of a message's ``_meta``.
- ``methods``: method and notification names, the log levels, and what the 2026-07-28 revision dropped or added.
- ``messages``: ``TypedDict`` shapes of the messages bastion reads field by field.
- ``headers``: the 2026-07-28 request-metadata headers: names, valid ``x-mcp-header`` annotations, the sentinel.

Nothing here imports from the rest of bastion, so any layer may import it; what each side *does* with these
(shaping, checking, relaying) stays in ``server/`` and ``upstream/``.
"""
