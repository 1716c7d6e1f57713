"""The ``auth`` section of the gateway config: parsed and validated once, at load time.

Three shapes are accepted::

    auth: none                      # explicit anonymous mode (local use)
    auth: {api_keys: [...], api_keys_file: keys.yaml, jwt: {...}, resource: ..., authorization_servers: [...]}
    (absent)                        # anonymous, but only when bastion listens on a loopback address

Only key *hashes* are accepted: a config file is reviewed, copied and committed, so it must never hold a secret.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import urlsplit

from bastion.errors import ConfigError
from bastion.units import parse_duration
from bastion.yamlfile import load_yaml_text

AuthMode = Literal["none", "enabled"]

HASH_PREFIX = "sha256:"
_HASH_RE = re.compile(r"sha256:[0-9a-f]{64}")
_KEY_ID_RE = re.compile(r"[^\s\x00-\x1f\x7f]{1,200}")
# RFC 6749 §3.3 scope-token; also keeps scopes safe to quote inside a WWW-Authenticate header.
_SCOPE_RE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")
_URL_UNSAFE_RE = re.compile(r'[\s"\\<>]')

# Asymmetric algorithms only. HS* would need a secret shared with the IdP and, worse, invites the classic
# algorithm-confusion attack (an HMAC "signed" with the public key); ``none`` is no signature at all.
SUPPORTED_ALGORITHMS = frozenset({
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA",
})

_TOP_KEYS = frozenset({"api_keys", "api_keys_file", "jwt", "resource", "authorization_servers", "scopes_supported"})
_KEY_ENTRY_KEYS = frozenset({"id", "hash", "groups", "attributes"})
_JWT_KEYS = frozenset({
    "issuer", "audience", "jwks_url", "algorithms", "groups_claim", "principal_claim", "leeway", "jwks_cache_ttl",
})


@dataclass(frozen=True, slots=True)
class ApiKeyEntry:
    """One API key as stored: never the key, only ``sha256:<hex>`` of it."""

    id: str
    hash: str
    groups: frozenset[str] = frozenset()
    attributes: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def digest(self) -> bytes:
        return bytes.fromhex(self.hash.removeprefix(HASH_PREFIX))

    def to_mapping(self) -> dict[str, Any]:
        """The entry as it is written in YAML (``auth.api_keys`` or the keys file)."""
        out: dict[str, Any] = {"id": self.id, "hash": self.hash}
        if self.groups:
            out["groups"] = sorted(self.groups)
        if self.attributes:
            out["attributes"] = dict(self.attributes)
        return out


@dataclass(frozen=True, slots=True)
class JwtConfig:
    issuer: str
    audience: tuple[str, ...]
    jwks_url: str
    algorithms: tuple[str, ...] = ("RS256",)
    groups_claim: str = "groups"
    principal_claim: str = "sub"
    leeway_s: float = 30.0
    jwks_cache_ttl_s: float = 300.0


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """``mode == "none"``: every caller is the anonymous principal. Otherwise at least one of ``api_keys`` and
    ``jwt`` is set; ``resource`` (bastion's canonical URI) and ``authorization_servers`` are set whenever ``jwt`` is.
    """

    mode: AuthMode
    # The key table at start: ``inline_api_keys`` (``auth.api_keys``, read with the config file, at start only)
    # and the entries of ``api_keys_file`` (resolved; re-read while the gateway runs: ``auth.keyfile``).
    api_keys: tuple[ApiKeyEntry, ...] = ()
    inline_api_keys: tuple[ApiKeyEntry, ...] = ()
    api_keys_file: Path | None = None
    jwt: JwtConfig | None = None
    resource: str | None = None
    authorization_servers: tuple[str, ...] = ()
    scopes_supported: tuple[str, ...] = ()

    @classmethod
    def none(cls) -> AuthConfig:
        return cls(mode="none")

    @classmethod
    def from_mapping(cls, data: object, path: str = "auth", *, listen_host: str,
                     base_dir: Path | None = None) -> AuthConfig:
        """Parse the ``auth`` section. ``data`` is the section's value: ``None`` when the key is absent, the
        string ``"none"``, or a mapping. ``base_dir`` resolves a relative ``api_keys_file`` (the config file's
        directory; the working directory when ``None``).
        """
        if data is None:
            if is_loopback_host(listen_host):
                return cls.none()
            raise ConfigError(
                f"no 'auth' section, and bastion listens on {listen_host!r}, which is not a loopback address; "
                "configure api_keys or jwt, or write 'auth: none' explicitly to serve anonymous callers",
                path=path)
        if data == "none":
            return cls.none()
        if isinstance(data, str):
            raise ConfigError(f"expected 'none' or a mapping, got {data!r}", path=path)
        mapping = _mapping(data, path)
        _reject_unknown(mapping, _TOP_KEYS, path)

        inline = tuple(_parse_key_entries(mapping.get("api_keys", []), f"{path}.api_keys"))
        entries = list(inline)
        keys_file = None
        if "api_keys_file" in mapping:
            keys_file = keys_file_path(mapping["api_keys_file"], f"{path}.api_keys_file", base_dir)
            entries.extend(load_keys_file(str(keys_file), f"{path}.api_keys_file"))
        _reject_duplicates(entries, path)

        resource = _opt_url(mapping.get("resource"), f"{path}.resource")
        jwt_cfg = None
        if "jwt" in mapping:
            jwt_cfg = _parse_jwt(mapping["jwt"], f"{path}.jwt", resource)
        if not entries and jwt_cfg is None:
            raise ConfigError("no way to authenticate anyone: configure api_keys, api_keys_file or jwt, "
                              "or write 'auth: none' for anonymous access", path=path)

        servers = tuple(_url(u, f"{path}.authorization_servers[{i}]")
                        for i, u in enumerate(_str_list(mapping.get("authorization_servers", []),
                                                        f"{path}.authorization_servers")))
        if jwt_cfg is not None:
            if resource is None:
                raise ConfigError("'resource' (bastion's canonical URI, e.g. https://bastion.example/mcp) is "
                                  "required when jwt is configured: tokens are checked against it and the "
                                  "protected resource metadata names it", path=f"{path}.resource")
            # The token issuer is the authorization server in nearly every deployment; say so by default.
            servers = servers or (jwt_cfg.issuer,)
        scopes = tuple(_str_list(mapping.get("scopes_supported", []), f"{path}.scopes_supported"))
        for i, scope in enumerate(scopes):
            if not _SCOPE_RE.fullmatch(scope):
                raise ConfigError(f"invalid scope {scope!r} (no spaces, quotes or backslashes)",
                                  path=f"{path}.scopes_supported[{i}]")
        return cls(mode="enabled", api_keys=tuple(entries), inline_api_keys=inline, api_keys_file=keys_file,
                   jwt=jwt_cfg, resource=resource,
                   authorization_servers=servers, scopes_supported=scopes)


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and addresses in 127.0.0.0/8 or ``::1``. Empty and wildcard hosts are not."""
    host = host.strip().strip("[]").lower()
    if host in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def keys_file_path(value: object, path: str, base_dir: Path | None = None) -> Path:
    """Where ``auth.api_keys_file`` points: relative to ``base_dir`` (the config file's directory)."""
    if not isinstance(value, str) or not value:
        raise ConfigError("expected a file path", path=path)
    file = Path(value)
    if not file.is_absolute() and base_dir is not None:
        file = base_dir / file
    return file


def load_keys_file(value: object, path: str, base_dir: Path | None = None) -> list[ApiKeyEntry]:
    """Read a keys file: a YAML list of entries, or a mapping with a single ``api_keys`` list."""
    file = keys_file_path(value, path, base_dir)
    return parse_keys_file(read_keys_file(file, path), file)


# The key file is read again while the gateway runs (``auth.keyfile``): a path pointed at a growing log or a disk
# image would be read whole on every look. 100,000 entries with groups and attributes stay far below this.
MAX_KEYS_FILE_BYTES = 64 * 2**20


def read_keys_file(file: Path, path: str) -> bytes:
    """The bytes of the keys file at ``file`` (``path``: the config key naming it, for the error).

    Only a regular file is read. A FIFO put in its place (or a device) would block the read for ever: at start-up
    the gateway would never start, and while it runs the watcher's read would never return, so no later change of
    the key file, a revocation included, would ever be applied, the status would still say ``ok``, and the stuck
    worker thread would hold up the process's exit. Opened without blocking and checked on the descriptor
    itself, so what is checked is what is read."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise ConfigError(f"cannot read keys file: not a regular file but {_file_kind(mode)}", path=path,
                                  source=str(file))
            os.set_blocking(fd, True)
            with os.fdopen(fd, "rb", closefd=False) as stream:
                data = stream.read(MAX_KEYS_FILE_BYTES + 1)
            if len(data) > MAX_KEYS_FILE_BYTES:
                raise ConfigError(f"keys file is larger than {MAX_KEYS_FILE_BYTES:,} bytes; is it the right file?",
                                  path=path, source=str(file))
            return data
        finally:
            os.close(fd)
    except OSError as exc:
        raise ConfigError(f"cannot read keys file: {exc.strerror or exc}", path=path, source=str(file)) from None


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((kind for test, kind in kinds if test(mode)), "not a file")


def parse_keys_file(data: bytes, file: Path) -> list[ApiKeyEntry]:
    """The entries the keys file ``file`` holds, ``data`` being its bytes."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("keys file is not valid UTF-8", source=str(file)) from None
    # Strict, as the policy files are (``bastion.yamlfile``): a key twice in one entry (two ``groups:``) is refused
    # rather than half-read, and anchors and aliases are refused: an alias can multiply a small file into a huge
    # table, and a key file is re-read while the gateway runs.
    doc = load_yaml_text(text, str(file)).data
    if isinstance(doc, Mapping):
        _reject_unknown(doc, frozenset({"api_keys"}), "api_keys_file")
        doc = doc.get("api_keys", [])
    try:
        return list(_parse_key_entries(doc if doc is not None else [], "api_keys"))
    except ConfigError as exc:
        raise ConfigError(exc.message, source=str(file), path=exc.path) from None


def _parse_key_entries(value: object, path: str) -> list[ApiKeyEntry]:
    if not isinstance(value, list):
        raise ConfigError("expected a list of {id, hash, groups, attributes} entries", path=path)
    return [parse_key_entry(item, f"{path}[{i}]") for i, item in enumerate(value)]


def parse_key_entry(value: object, path: str) -> ApiKeyEntry:
    if isinstance(value, str):
        raise ConfigError("expected a mapping {id, hash}; if this is a key itself, do not put keys in config: "
                          "store only its hash (see 'bastion keys hash')", path=path)
    mapping = _mapping(value, path)
    for plaintext in ("key", "secret", "api_key", "token"):
        if plaintext in mapping:
            raise ConfigError(f"'{plaintext}' looks like a plaintext key; config holds only hashes: replace it "
                              "with 'hash: sha256:...' (see 'bastion keys hash')", path=f"{path}.{plaintext}")
    _reject_unknown(mapping, _KEY_ENTRY_KEYS, path)
    key_id = mapping.get("id")
    if not isinstance(key_id, str) or not _KEY_ID_RE.fullmatch(key_id):
        raise ConfigError("'id' must be a non-empty string without whitespace", path=f"{path}.id")
    digest = mapping.get("hash")
    if not isinstance(digest, str) or not _HASH_RE.fullmatch(digest.strip().lower()):
        raise ConfigError("'hash' must be 'sha256:' followed by 64 hex digits; plaintext keys are not accepted "
                          "(create the hash with 'bastion keys hash' or 'bastion keys generate')",
                          path=f"{path}.hash")
    groups = frozenset(_str_list(mapping.get("groups", []), f"{path}.groups"))
    attributes = _mapping(mapping.get("attributes", {}), f"{path}.attributes")
    for k in attributes:
        if not isinstance(k, str):
            raise ConfigError("attribute names must be strings", path=f"{path}.attributes")
    return ApiKeyEntry(id=key_id, hash=digest.strip().lower(), groups=groups,
                       attributes=MappingProxyType(dict(attributes)))


def key_table_entries(inline: Sequence[ApiKeyEntry], from_file: Sequence[ApiKeyEntry],
                      file: Path) -> tuple[ApiKeyEntry, ...]:
    """The entries of a key table made from ``auth.api_keys`` and a (re-)read key file, under the rules the
    config load applies: no id twice, no hash twice, across both."""
    ids = {entry.id for entry in inline}
    hashes = {entry.hash for entry in inline}
    for i, entry in enumerate(from_file):
        if entry.id in ids:
            raise ConfigError(f"API key id {entry.id!r} is also in auth.api_keys of the config file",
                              source=str(file), path=f"api_keys[{i}].id")
        if entry.hash in hashes:
            raise ConfigError(f"API key {entry.id!r} has the same hash as an entry in auth.api_keys of the config "
                              "file", source=str(file), path=f"api_keys[{i}].hash")
    try:
        _reject_duplicates(from_file, "api_keys_file")
    except ConfigError as exc:
        raise ConfigError(exc.message, source=str(file)) from None
    return (*inline, *from_file)


def _reject_duplicates(entries: Sequence[ApiKeyEntry], path: str) -> None:
    ids: set[str] = set()
    hashes: set[str] = set()
    for entry in entries:
        if entry.id in ids:
            raise ConfigError(f"duplicate API key id {entry.id!r}", path=f"{path}.api_keys")
        if entry.hash in hashes:
            # Two ids for one key would make the principal depend on table order.
            raise ConfigError(f"API key {entry.id!r} has the same hash as another entry", path=f"{path}.api_keys")
        ids.add(entry.id)
        hashes.add(entry.hash)


def _parse_jwt(value: object, path: str, resource: str | None) -> JwtConfig:
    mapping = _mapping(value, path)
    _reject_unknown(mapping, _JWT_KEYS, path)
    issuer = _required_str(mapping, "issuer", path)
    jwks_url = _url(_required_str(mapping, "jwks_url", path), f"{path}.jwks_url")
    if urlsplit(jwks_url).scheme != "https" and not is_loopback_host(urlsplit(jwks_url).hostname or ""):
        # Keys fetched over plain HTTP can be swapped by anyone on the path, which forges every token.
        raise ConfigError("jwks_url must use https (plain http is allowed only for a loopback host)",
                          path=f"{path}.jwks_url")
    if "audience" in mapping:
        raw_aud = mapping["audience"]
        audience = tuple([raw_aud] if isinstance(raw_aud, str) else _str_list(raw_aud, f"{path}.audience"))
        if not audience or not all(audience):
            raise ConfigError("audience must be a non-empty string or list", path=f"{path}.audience")
    elif resource is not None:
        audience = (resource,)
    else:
        raise ConfigError("set 'auth.resource' (tokens must be issued for bastion itself) or 'audience'",
                          path=f"{path}.audience")
    algorithms = tuple(_str_list(mapping.get("algorithms", ["RS256"]), f"{path}.algorithms"))
    if not algorithms:
        raise ConfigError("list at least one algorithm", path=f"{path}.algorithms")
    for alg in algorithms:
        if alg not in SUPPORTED_ALGORITHMS:
            raise ConfigError(f"algorithm {alg!r} is not allowed; use asymmetric algorithms only: "
                              f"{', '.join(sorted(SUPPORTED_ALGORITHMS))}", path=f"{path}.algorithms")
    ttl = parse_duration(mapping.get("jwks_cache_ttl", 300), f"{path}.jwks_cache_ttl")
    return JwtConfig(
        issuer=issuer, audience=audience, jwks_url=jwks_url, algorithms=algorithms,
        groups_claim=_opt_str(mapping, "groups_claim", path) or "groups",
        principal_claim=_opt_str(mapping, "principal_claim", path) or "sub",
        leeway_s=parse_duration(mapping.get("leeway", 30), f"{path}.leeway"),
        jwks_cache_ttl_s=max(ttl, 1.0),
    )


def _mapping(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"expected a mapping, got {type(value).__name__}", path=path)
    return value


def _reject_unknown(mapping: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise ConfigError(f"unknown key {key!r} (allowed: {', '.join(sorted(allowed))})", path=f"{path}.{key}")


def _str_list(value: object, path: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError("expected a list of non-empty strings", path=path)
    return list(value)


def _required_str(mapping: Mapping[str, Any], key: str, path: str) -> str:
    value = mapping.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"'{key}' is required (a non-empty string)", path=f"{path}.{key}")
    return value


def _opt_str(mapping: Mapping[str, Any], key: str, path: str) -> str | None:
    return _required_str(mapping, key, path) if key in mapping else None


def _url(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise ConfigError("expected a URL", path=path)
    parts = urlsplit(value)
    if _URL_UNSAFE_RE.search(value):
        raise ConfigError(f"URL contains spaces, quotes or other unsafe characters: {value!r}", path=path)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.fragment:
        raise ConfigError(f"expected an absolute http(s) URL without fragment, got {value!r}", path=path)
    return value


def _opt_url(value: object, path: str) -> str | None:
    return None if value is None else _url(value, path)
