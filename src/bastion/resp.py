"""A lean Redis client for the rate limiter's hot path: one multiplexed connection speaking RESP2.

Why: with the full pipeline, the limiter's one ``EVALSHA`` per call went through redis-py's asyncio client, which
costs about a quarter of the gateway's CPU per call (``python bench/loadgen.py --scenario full --profile DIR``): a
pool checkout with its health bookkeeping and observability hooks, a retry wrapper, command packing through
encoders, and an asyncio stream read per reply line. Redis itself spends a few microseconds on the script. This
client does the same exchange with a handful of Python calls, as ``upstream/connections.py`` does for HTTP.

What it does, and what it keeps of redis-py's behaviour (``redisconn`` sets the policy for both):

- **One connection, shared by every caller.** Commands are written in the order they are issued and Redis answers
  in that order, so each reply belongs to the oldest caller still waiting: pipelining without a pipeline object.
  The commands issued in one turn of the event loop leave in one write at its end, so under load Redis reads
  many with one system call.
  A caller that gave up (its deadline passed, its request was cancelled) leaves its place in the line; the reply
  that comes for it is dropped.
- **Connect**: TCP with keepalive, TLS for ``rediss://`` (the system's CA store, host name checked), or a Unix
  socket; ``AUTH`` and ``SELECT`` first when the URL names a user, a password or a database. At most one connect is
  in progress; every caller waits for it.
- **Replies**: RESP2 (simple strings, errors, integers, bulk strings as ``bytes``, arrays, nested).
- **Errors** are redis-py's own exception classes, so every caller's handling is unchanged: ``NOSCRIPT`` is
  ``NoScriptError``, an authentication failure ``AuthenticationError``, any other error reply ``ResponseError``, a
  connection that failed or closed ``ConnectionError``, a connect or an answer that took too long ``TimeoutError``.
- **One retry** (``retries``): a command that meets a dead connection (after a Redis restart, say) is sent once more
  on a new one, as redis-py's ``Retry(NoBackoff(), 1)`` does. As there, a command may then run twice if the
  connection died after Redis ran it; the limiter tolerates that (a call counted twice).
- **A silent server**: a connection whose oldest command has waited longer than ``socket_timeout`` is closed, its
  callers get ``TimeoutError``, and the next command opens a new one (redis-py closes a connection whose read timed
  out). A connection left idle longer than ``health_check_interval`` is replaced before use rather than trusted
  (redis-py PINGs it first), so one a NAT or load balancer dropped silently costs no failed call.

Only a single server is served this way (``LeanTarget.parse``: ``redis://``, ``rediss://`` or ``unix://`` without
query options). Sentinel, Cluster and URLs with options keep redis-py, as does everything off the hot path.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from redis.exceptions import AuthenticationError, DataError, NoScriptError, ReadOnlyError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["ErrorReply", "Incomplete", "LeanRedis", "LeanTarget", "ProtocolViolation", "encode_command", "parse_reply"]

_DEFAULT_PORT = 6379
# Arrays nest this deep at most; Redis itself never sends deeper replies to the commands sent here.
_MAX_DEPTH = 32
_CRLF = b"\r\n"


class Incomplete(Exception):
    """The buffer ends inside a reply; more bytes are needed."""


class ProtocolViolation(Exception):
    """Bytes that are not RESP2."""


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An error reply inside an array (a script's ``redis.error_reply`` in a table, say): a value, not a failure."""

    message: str


@dataclass(frozen=True, slots=True)
class LeanTarget:
    """One Redis server, from a URL this client reads exactly as redis-py does."""

    host: str = ""
    port: int = _DEFAULT_PORT
    path: str = ""  # a Unix socket, instead of host and port
    tls: bool = False
    username: str | None = None
    password: str | None = None
    db: int = 0

    @classmethod
    def parse(cls, url: str) -> LeanTarget | None:
        """The server ``url`` names, or None for a URL this client leaves to redis-py (query options, Sentinel,
        Cluster, anything unusual): when in doubt, the full client."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return None
        if parts.query or parts.fragment:
            return None
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        if parts.scheme == "unix":
            if not parts.path or parts.hostname:
                return None
            return cls(path=parts.path, username=username, password=password)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            return None
        db_text = parts.path.lstrip("/")
        if db_text and not db_text.isdigit():
            return None
        return cls(host=parts.hostname, port=port or _DEFAULT_PORT, tls=parts.scheme == "rediss",
                   username=username, password=password, db=int(db_text) if db_text else 0)

    @property
    def shown(self) -> str:
        return self.path or f"{self.host}:{self.port}"


def encode_command(args: Sequence[str | bytes | int | float]) -> bytes:
    """One command as a RESP2 array of bulk strings, as redis-py encodes it (str as UTF-8, numbers as text)."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, bool):
            raise DataError("Invalid input of type: 'bool'. Convert to a bytes, string, int or float first.")
        elif isinstance(arg, int):
            data = b"%d" % arg
        elif isinstance(arg, float):
            data = repr(arg).encode()
        else:
            raise DataError(f"Invalid input of type: {type(arg).__name__!r}. Convert to a bytes, string, int or "
                            f"float first.")
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def parse_reply(buf: bytes | bytearray, pos: int = 0, depth: int = 0) -> tuple[Any, int]:
    """One reply from ``buf`` at ``pos``: the value and where the next reply starts. A top-level error is returned
    as ``ErrorReply`` too; the caller decides what it means. Raises ``Incomplete`` when ``buf`` ends first."""
    end = buf.find(_CRLF, pos)
    if end < 0:
        raise Incomplete
    kind = buf[pos]
    line = bytes(buf[pos + 1:end])
    after = end + 2
    if kind == 0x2B:  # +
        return line.decode("utf-8", "replace"), after
    if kind == 0x3A:  # :
        return _int(line), after
    if kind == 0x24:  # $
        size = _int(line)
        if size < 0:
            return None, after
        if len(buf) < after + size + 2:
            raise Incomplete
        if buf[after + size:after + size + 2] != _CRLF:
            raise ProtocolViolation("bulk string not terminated by CRLF")
        return bytes(buf[after:after + size]), after + size + 2
    if kind == 0x2A:  # *
        count = _int(line)
        if count < 0:
            return None, after
        if depth >= _MAX_DEPTH:
            raise ProtocolViolation(f"arrays nested deeper than {_MAX_DEPTH}")
        items = []
        for _ in range(count):
            item, after = parse_reply(buf, after, depth + 1)
            items.append(item)
        return items, after
    if kind == 0x2D:  # -
        return ErrorReply(line.decode("utf-8", "replace")), after
    raise ProtocolViolation(f"unknown reply type {bytes([kind])!r}")


def _int(line: bytes) -> int:
    try:
        return int(line)
    except ValueError:
        raise ProtocolViolation(f"not an integer: {line[:32]!r}") from None


def error_for(message: str) -> RedisError:
    """redis-py's exception for an error reply (``redis._parsers.base.BaseParser.parse_error``, for the replies
    the commands sent here can get)."""
    code = message.split(" ", 1)[0]
    if code == "NOSCRIPT":
        return NoScriptError(message[len(code) + 1:])
    if code in ("NOAUTH", "WRONGPASS", "NOPERM") or message.startswith("ERR invalid password"):
        return AuthenticationError(message)
    if code == "READONLY":
        return ReadOnlyError(message[len(code) + 1:])
    return ResponseError(message)


class _Connection(asyncio.Protocol):
    """One connection and the callers waiting on it, oldest first."""

    def __init__(self, loop: asyncio.AbstractEventLoop, target: LeanTarget) -> None:
        self.loop = loop
        self._target = target
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.last_used = loop.time()
        # (the caller's future, when its command was written); a reply goes to the leftmost.
        self.waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._buffer = bytearray()
        # Commands issued in this turn of the event loop, written together at its end (one send, one read for
        # Redis, however many calls asked at once).
        self._out: list[bytes] = []

    # -- asyncio.Protocol ------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        pos = 0
        waiting = self.waiting
        try:
            while pos < len(buffer):
                value, pos = parse_reply(buffer, pos)
                if not waiting:
                    raise ProtocolViolation("a reply nobody asked for")
                future, _ = waiting.popleft()
                if future.done():
                    continue  # the caller gave up; its reply still had to be read
                if type(value) is ErrorReply:
                    future.set_exception(error_for(value.message))
                else:
                    future.set_result(value)
        except Incomplete:
            pass
        except ProtocolViolation as exc:
            self.fail(RedisConnectionError(f"Protocol error from {self._target.shown}: {exc}"))
            return
        if pos:
            del buffer[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        detail = f": {exc}" if exc is not None else ""
        self.fail(RedisConnectionError(f"Connection to {self._target.shown} closed{detail}"))

    # -- used by the client ----------------------------------------------------------------------------------

    def send(self, payload: bytes) -> asyncio.Future[Any]:
        assert self.transport is not None
        future: asyncio.Future[Any] = self.loop.create_future()
        now = self.loop.time()
        self.waiting.append((future, now))
        self.last_used = now
        if not self._out:
            self.loop.call_soon(self._flush)
        self._out.append(payload)
        return future

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and not self.lost:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def stuck_for(self, now: float) -> float:
        """How long the oldest caller has been waiting for its reply (0 when nobody waits)."""
        return now - self.waiting[0][1] if self.waiting else 0.0

    def fail(self, exc: Exception) -> None:
        """Close the connection; every caller still waiting gets ``exc``."""
        self.lost = True
        waiting, self.waiting = self.waiting, deque()
        for future, _ in waiting:
            if not future.done():
                future.set_exception(exc)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class LeanRedis:
    """A single Redis server, for the commands of the rate limiter's hot path (scripts, plain commands).

    The methods the limiter's ``Script`` calls are named and shaped as redis-py's (``evalsha``, ``script_load``),
    so either client runs a script.
    """

    def __init__(self, target: LeanTarget, *, socket_timeout: float, connect_timeout: float, retries: int = 1,
                 health_check_interval: float = 30.0) -> None:
        self.target = target
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.retries = retries
        self.health_check_interval = health_check_interval
        self._conn: _Connection | None = None
        self._connecting: asyncio.Task[_Connection] | None = None
        self._closed = False
        self._tls: ssl.SSLContext | None = None

    async def execute(self, *args: str | bytes | int | float) -> Any:
        payload = encode_command(args)
        attempt = 0
        while True:
            conn = self._conn
            if conn is None or conn.lost or not self._usable(conn):
                conn = await self._connection()
            try:
                return await conn.send(payload)
            except (RedisConnectionError, RedisTimeoutError):
                if attempt >= self.retries or self._closed:
                    raise
                attempt += 1
            except asyncio.CancelledError:
                # The caller's deadline (or its request) ended the wait. A connection that has not answered its
                # oldest command for socket_timeout is not coming back: close it now so the next call starts over.
                self._close_if_stuck(conn)
                raise

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: str | bytes | int | float) -> Any:
        return await self.execute("EVALSHA", sha, numkeys, *keys_and_args)

    async def script_load(self, script: str) -> Any:
        return await self.execute("SCRIPT", "LOAD", script)

    async def ping(self) -> Any:
        return await self.execute("PING")

    async def aclose(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.fail(RedisConnectionError("client closed"))

    # -- connections -----------------------------------------------------------------------------------------

    def _usable(self, conn: _Connection) -> bool:
        """Whether ``conn`` may take another command; if not, it is closed here."""
        now = conn.loop.time()
        if conn.waiting:
            if conn.stuck_for(now) <= self.socket_timeout:
                return True
            conn.fail(RedisTimeoutError(f"Timeout reading from {self.target.shown}"))
            return False
        if now - conn.last_used <= self.health_check_interval:
            return True
        conn.fail(RedisConnectionError("idle connection replaced"))
        return False

    def _close_if_stuck(self, conn: _Connection) -> None:
        if not conn.lost and conn.stuck_for(conn.loop.time()) > self.socket_timeout:
            conn.fail(RedisTimeoutError(f"Timeout reading from {self.target.shown}"))

    async def _connection(self) -> _Connection:
        if self._closed:
            raise RedisConnectionError("client closed")
        task = self._connecting
        if task is None:
            task = self._connecting = asyncio.get_running_loop().create_task(self._open())
            task.add_done_callback(self._connected)
        # Shielded: a caller that gives up does not abort the connect the others are waiting for.
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                # The connect was cancelled by ``aclose``, not this caller: a closed client, not a cancellation.
                raise RedisConnectionError("client closed") from None
            raise

    def _connected(self, task: asyncio.Task[_Connection]) -> None:
        self._connecting = None
        if not task.cancelled() and task.exception() is None:
            self._conn = task.result()

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        target = self.target
        try:
            async with asyncio.timeout(self.connect_timeout):
                if target.path:
                    _, conn = await loop.create_unix_connection(lambda: _Connection(loop, target), target.path)
                else:
                    tls = None
                    if target.tls:
                        if self._tls is None:
                            self._tls = ssl.create_default_context()
                        tls = self._tls
                    _, conn = await loop.create_connection(lambda: _Connection(loop, target), target.host,
                                                           target.port, ssl=tls,
                                                           server_hostname=target.host if tls is not None else None)
                    sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
                    if sock is not None:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                await self._hello(conn)
        except TimeoutError:
            raise RedisTimeoutError(f"Timeout connecting to {target.shown}") from None
        except OSError as exc:
            raise RedisConnectionError(f"Error connecting to {target.shown}: {type(exc).__name__}: {exc}") from None
        return conn

    async def _hello(self, conn: _Connection) -> None:
        """AUTH and SELECT, pipelined, before anyone else's command: a failure fails the connect."""
        target = self.target
        replies = []
        if target.password is not None:
            auth = ("AUTH", target.username, target.password) if target.username else ("AUTH", target.password)
            replies.append(conn.send(encode_command(auth)))
        if target.db:
            replies.append(conn.send(encode_command(("SELECT", target.db))))
        try:
            for reply in replies:
                await reply
        except (ResponseError, RedisConnectionError):
            conn.fail(RedisConnectionError("connect aborted"))
            raise
