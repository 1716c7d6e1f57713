"""Resource URIs in one canonical form: what the policy judges is exactly what the upstream is sent.

An upstream resolves a URI the usual way (scheme case-insensitive, percent-decoding, dot segments, doubled
slashes, ``file://localhost/``), so ``probe+FILE:///srv/%73ecret//key.pem`` and ``probe+file:///srv/secret/key.pem``
name one resource. A deny rule matched over the spelling a client chose would be evaded by any other spelling;
so every URI a client sends is brought to one form first (``canonical_uri``), and that form is what the policy
decides on, what ``bastion policy explain`` shows and what is forwarded upstream. Rule globs are brought to the
same form (``canonical_glob``), so an admin may write either spelling.

The form is RFC 3986 §6.2.2 syntax-based normalisation, plus two steps for hierarchical URIs:

- the scheme (with its ``<prefix>+``) and the host are lowercased; an empty port is dropped;
- percent-encoded unreserved characters (``A-Z a-z 0-9 - . _ ~``) are decoded, other escapes get uppercase hex;
- in a path that starts with ``/``: dot segments are removed (``/a/./b/../c`` is ``/a/c``) and empty segments
  collapsed (``/a//b`` is ``/a/b``); a trailing ``/`` stays (``/dir/`` and ``/dir`` may differ);
- ``file:`` (also ``<prefix>+file:``): ``file://localhost/p`` and ``file:/p`` are ``file:///p`` (RFC 8089).

URIs that cannot be judged safely are refused with a reason (``UriRefused``), never guessed at: characters outside
printable ASCII, a backslash, an encoded ``/``, ``\\`` or NUL (``%2F``, ``%5C``, ``%00``: the upstream's path would
have other segments than the one judged), an encoded ``%`` (``%25``: a second decoding would change it again), a
``%`` not followed by two hex digits.
"""

from __future__ import annotations

import re

__all__ = ["UriRefused", "canonical_glob", "canonical_uri", "glob_problem", "try_canonical"]

# Printable ASCII without space: what a URI may contain once percent-encoded.
_URI = re.compile(r"[\x21-\x7e]+")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_STRAY_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_REFUSED_ESCAPES = {"2F": "an encoded '/' (%2F)", "5C": "an encoded backslash (%5C)", "00": "an encoded NUL (%00)",
                    "25": "an encoded '%' (%25, double encoding)"}
# Everything before the first ':' that has none of '/?#': the scheme (a glob's may hold wildcards).
_SCHEME = re.compile(r"([^:/?#]+):")
# Stand-ins for a glob's wildcards while its literal parts are normalised: outside the URI alphabet, so no step
# of the normalisation can mistake them for URI syntax.
_STAR, _ONE = "\ue000", "\ue001"


class UriRefused(ValueError):
    """A URI bastion will not judge: ``reason`` says why, in words fit for the client."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def canonical_uri(uri: str) -> str:
    """The canonical form of ``uri`` (see the module); raises ``UriRefused`` for a URI that cannot be judged.

    Not cached: the URIs are the clients', as long as a request body allows, and a process-wide cache of them
    would hold thousands of such bodies; normalising one is cheap beside the upstream request it precedes."""
    if _URI.fullmatch(uri) is None:
        raise UriRefused("characters outside printable ASCII (percent-encode them)")
    if "\\" in uri:
        raise UriRefused("a backslash")
    if _STRAY_PERCENT.search(uri):
        raise UriRefused("a '%' not followed by two hex digits")
    for escape in _ESCAPE.finditer(uri):
        refused = _REFUSED_ESCAPES.get(escape.group(1).upper())
        if refused is not None:
            raise UriRefused(refused)
    return _normalise(uri)


def try_canonical(uri: str) -> str | None:
    """``canonical_uri``, or None for a refused URI."""
    try:
        return canonical_uri(uri)
    except UriRefused:
        return None


def canonical_glob(text: str) -> str:
    """A resource glob (``policy.names``: ``*``, ``?``, ``\\`` escapes) with its literal parts in canonical form, in
    the same syntax. Wildcards are kept where they are; ``FILE:///srv/%73ecret/*`` becomes ``file:///srv/secret/*``.
    """
    out = []
    for c in _normalise(_marked(text)):
        if c in "*?\\":
            out.append("\\" + c)
        else:
            out.append("*" if c == _STAR else "?" if c == _ONE else c)
    return "".join(out)


def glob_problem(text: str) -> str | None:
    """Why a resource glob can never match a canonical URI (dot segments, refused escapes), or None."""
    decoded = _ESCAPE.sub(_escape, _marked(text))
    for escape in _ESCAPE.finditer(decoded):
        refused = _REFUSED_ESCAPES.get(escape.group(1).upper())
        if refused is not None:
            return f"it contains {refused}, and bastion refuses such URIs"
    hier = re.split(r"[?#]", decoded, maxsplit=1)[0]
    if any(seg in (".", "..") for seg in hier.split("/")):
        return "it contains a '.' or '..' segment, and bastion resolves those before matching"
    return None


def _marked(text: str) -> str:
    """A glob as a URI: wildcards as their stand-ins, escaped characters as themselves."""
    marked: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            marked.append(text[i + 1])
            i += 2
            continue
        marked.append(_STAR if c == "*" else _ONE if c == "?" else c)
        i += 1
    return "".join(marked)


def _escape(match: re.Match[str]) -> str:
    char = chr(int(match.group(1), 16))
    return char if char in _UNRESERVED else "%" + match.group(1).upper()


def _normalise(text: str) -> str:
    # Decoding unreserved characters first is safe: none of them is a delimiter.
    text = _ESCAPE.sub(_escape, text)
    scheme_match = _SCHEME.match(text)
    if scheme_match is None:
        return text  # a relative reference: nothing more to normalise safely
    scheme = scheme_match.group(1).lower()
    rest = text[scheme_match.end():]
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    hier, tail = rest[:cut], rest[cut:]
    is_file = scheme == "file" or scheme.endswith("+file")
    authority: str | None = None
    if hier.startswith("//"):
        end = hier.find("/", 2)
        authority, path = (hier[2:], "") if end < 0 else (hier[2:end], hier[end:])
        authority = _authority(authority)
        if is_file and authority == "localhost":
            authority = ""
    else:
        path = hier
        if is_file and path.startswith("/"):
            authority = ""
    if path.startswith("/"):
        path = _path(path)
    return f"{scheme}:" + ("" if authority is None else "//" + authority) + path + tail


def _authority(authority: str) -> str:
    userinfo, at, hostport = authority.rpartition("@")
    if hostport.startswith("["):  # an IP literal: its port follows the ']'
        close = hostport.find("]")
        host, port = (hostport, "") if close < 0 else (hostport[:close + 1], hostport[close + 1:])
    else:
        colon = hostport.find(":")
        host, port = (hostport, "") if colon < 0 else (hostport[:colon], hostport[colon:])
    if port == ":":
        port = ""
    return userinfo + at + host.lower() + port


def _path(path: str) -> str:
    """Remove dot segments (RFC 3986 §5.2.4) and collapse empty ones; keep a trailing '/'."""
    out: list[str] = []
    slash_end = False
    for seg in path.split("/")[1:]:
        if seg == "..":
            if out:
                out.pop()
            slash_end = True
        elif seg in ("", "."):
            slash_end = True
        else:
            out.append(seg)
            slash_end = False
    return "/" + "/".join(out) + ("/" if slash_end and out else "")
