"""An upstream MCP server run as a child process, speaking newline-delimited JSON-RPC on stdin/stdout.

The child runs in a process group of its own (``bastion.upstream.child``). It is the server: when it exits, the
connection is lost even if a helper it started still holds its stdout, and what it left in its group is killed.
The child gets a minimal environment (``INHERITED_ENV`` plus its configured ``env``), so bastion's own secrets
never leak into servers that do not need them. Its stderr is the server's log and goes into ours, bounded
(``bastion.upstream.stderr``: lines cut at 4 KiB, rate-limited, escaped). Its stdout is framed by
``bastion.upstream.lines``: a message may be ``max_message_bytes`` long, yet a flood of small ones waits in the
pipe, not in bastion (at most about 128 KiB of it is read ahead). When the
child dies, requests in flight fail with ``UpstreamUnavailable`` and the supervisor restarts it; a restarted
server may have a different tool list, so the restart is announced as ``notifications/tools/list_changed``.
A child that runs but cannot be talked to is replaced the same way: one that closed its stdin once the shutdown
grace period has passed (``_watch_stdin``), one that stopped answering when the pool finds it ``down`` (``restart``).

Era (``era="auto"``): each new process is probed with ``server/discover``. A ``DiscoverResult`` makes it a
2026-07-28 server (per-request ``_meta``, no handshake, changes via ``subscriptions/listen``); any other error,
or no answer within ``probe_timeout``, makes it a handshake-era server, which gets ``initialize``. A restarted
binary may be a different version, so the era is decided per process.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import structlog

from bastion import __version__
from bastion.errors import UNSUPPORTED_PROTOCOL_VERSION, UpstreamRpcError, UpstreamTimeout, UpstreamUnavailable
from bastion.protocol.methods import DISCOVER, INITIALIZE, INITIALIZED, TOOLS_LIST_CHANGED
from bastion.stopping import finish
from bastion.upstream.base import EraSetting, NotificationHandler, RelatedMessageHandler, UpstreamInfo
from bastion.upstream.bodies import DEFAULT_MAX_MESSAGE_BYTES
from bastion.upstream.child import Child, spawn
from bastion.upstream.handshake import initialize_params, parse_initialize_result
from bastion.upstream.lines import PIPE_LIMIT, read_lines
from bastion.upstream.modern import (
    discover_verdict,
    envelope,
    error_verdict,
    offers_list_changes,
    parse_discover_result,
)
from bastion.upstream.modern_client import Listener, ModernCalls, listen_request
from bastion.upstream.session import DEFAULT_SERVER_REQUESTS, Pending, RpcSession, ServerRequests, StrayHandler
from bastion.upstream.stderr import DEFAULT_STDERR, StderrHook, StderrLimits, StderrLog, pump_stderr
from bastion.upstream.supervisor import Backoff, StateListener, Supervisor

__all__ = ["INHERITED_ENV", "STDIN_HIGH_WATER", "StdioUpstream"]

log = structlog.get_logger("bastion.upstream")

# Bytes written to a child's stdin and not yet taken by it past which bastion writes nothing more: a child that
# stops reading must not make the pipe transport's buffer (``StreamWriter.write`` never blocks) grow without
# bound. The write fails at once (``UpstreamUnavailable``) instead; one message is always accepted below it.
STDIN_HIGH_WATER = 4 << 20
# What a typical server (python, node, npx) needs to start; everything else must be configured explicitly.
INHERITED_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")



class StdioUpstream:
    def __init__(self, name: str, command: Sequence[str], env: Mapping[str, str] | None = None,
                 cwd: str | None = None, *, init_timeout: float = 30.0, backoff_initial: float = 0.5,
                 backoff_max: float = 30.0, shutdown_grace: float = 2.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, era: EraSetting = "auto",
                 probe_timeout: float = 10.0, on_stray: StrayHandler | None = None,
                 server_requests: ServerRequests = DEFAULT_SERVER_REQUESTS,
                 stderr: StderrLimits = DEFAULT_STDERR, on_stderr: StderrHook | None = None) -> None:
        if not command:
            raise ValueError("command must not be empty")
        self.name = name
        self._command = list(command)
        self._env = dict(env or {})
        self._cwd = cwd
        self._init_timeout = init_timeout
        self._grace = shutdown_grace
        self._limit = max_message_bytes
        self._era = era
        self._probe_timeout = min(probe_timeout, init_timeout)
        self._rpc = RpcSession(name, self._write, on_stray=on_stray, server_requests=server_requests)
        self._calls: ModernCalls | None = None
        self._listener = Listener(name, self._open_listen, lambda: self._rpc.on_notification,
                                  Backoff(backoff_initial, backoff_max))
        self._listening: asyncio.Task[None] | None = None
        self._supervisor = Supervisor(name, self._connect, self._announce_restart,
                                      Backoff(backoff_initial, backoff_max))
        self._proc: Child | None = None
        self._closing = False
        self._stderr_log = StderrLog(name, stderr, on_lines=on_stderr)

    @property
    def info(self) -> UpstreamInfo | None:
        return self._supervisor.info

    @property
    def pid(self) -> int | None:
        """The current child's pid (operators and tests use it to find the process)."""
        return self._proc.pid if self._proc is not None else None

    async def start(self, on_notification: NotificationHandler) -> UpstreamInfo:
        # Also after ``close`` (the pool retries a failed start on the same object): a child that dies must be
        # noticed and restarted again, which ``_closing`` would prevent.
        self._closing = False
        self._listener.reset()
        self._rpc.on_notification = on_notification
        return await self._supervisor.start()

    def watch(self, listener: StateListener) -> None:
        """Hear when the connection is being re-established and when it is back (upstream health)."""
        self._supervisor.on_state = listener

    async def request(self, method: str, params: Mapping[str, Any] | None, *, timeout: float,
                      on_message: RelatedMessageHandler | None = None) -> dict[str, Any]:
        # One deadline for the caller: time spent waiting for a restarting child comes out of it.
        deadline = asyncio.get_running_loop().time() + timeout
        await self._supervisor.ready(timeout)
        calls = self._calls
        left = self._rpc.remaining(deadline)
        if calls is None:
            return await self._rpc.call(method, params, timeout=left, on_message=on_message,
                                        transmit=self._transmit, reported_timeout=timeout)
        result = await self._rpc.call(method, calls.params(params), timeout=left, on_message=on_message,
                                      transmit=self._transmit, reported_timeout=timeout)
        return calls.result(method, params, result)

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        await self._rpc.notify(method, params)

    def restart(self, reason: str) -> bool:
        """Replace the child, which runs but does not answer (its health reached ``down``): it is stopped as at
        shutdown (end of input, SIGTERM, SIGKILL, to its process group), then started again with the supervisor's
        backoff. False when there is no live connection to replace (not started, or already restarting)."""
        proc = self._proc
        if proc is None or self._closing or not self._supervisor.connected or proc.has_exited():
            return False  # (``_replace`` checks the same; checked here so that no restart is logged for nothing)
        log.warning("upstream.restart", upstream=self.name, pid=proc.pid, reason=reason)
        self._replace(proc, f"unresponsive, restarted: {reason}")
        return True

    async def close(self) -> None:
        self._closing = True
        self._stop_listening()
        await self._supervisor.aclose()
        proc, self._proc = self._proc, None
        if proc is not None:
            await self._stop(proc)
        await self._rpc.aclose()

    # -- process lifecycle -----------------------------------------------------------------------------------

    def _child_env(self) -> dict[str, str]:
        env = {k: v for k in INHERITED_ENV if (v := os.environ.get(k)) is not None}
        env.update(self._env)
        return env

    async def _connect(self) -> UpstreamInfo:
        try:
            # A small limit: the pipes are paused past twice it unread (upstream.lines); a message up to
            # max_message_bytes is assembled by read_lines, not by the StreamReader.
            proc = await spawn(self._command, env=self._child_env(), cwd=self._cwd, limit=PIPE_LIMIT)
        except OSError as exc:
            raise UpstreamUnavailable(self.name, log_detail=f"cannot start {self._command[0]!r}: {exc}") from None
        log.info("upstream.spawned", upstream=self.name, pid=proc.pid, command=self._command[0])
        self._proc = proc
        reader = self._rpc.spawn(self._read_stdout(proc))
        self._rpc.spawn(self._read_stderr(proc))
        self._rpc.spawn(self._watch_exit(proc, reader))
        self._rpc.spawn(self._watch_stdin(proc))
        self._stop_listening()
        try:
            info = await self._handshake()
        except BaseException:
            self._proc = None
            # To its end even through shutdown's repeated cancellations: cut short, it leaves the child running.
            await finish(self._stop(proc))
            raise
        modern = info.era == "modern"
        self._calls = ModernCalls(self.name) if modern else None
        self._rpc.accept_server_requests = not modern
        log.info("upstream.era_detected", upstream=self.name, era=info.era, version=info.protocol_version)
        if modern and offers_list_changes(info.capabilities):
            self._listening = self._rpc.spawn(self._listener.run())
        return info

    async def _handshake(self) -> UpstreamInfo:
        if self._era == "legacy":
            return await self._initialize()
        if self._era == "modern":
            return await self._discover(self._init_timeout)
        try:
            result = await self._rpc.call(DISCOVER, envelope(None, __version__), timeout=self._probe_timeout,
                                          on_message=None, transmit=self._transmit)
        except UpstreamTimeout:
            verdict = "legacy"
        except UpstreamRpcError as exc:
            verdict = error_verdict(exc.to_error())
            if verdict != "legacy":
                raise UpstreamUnavailable(self.name, log_detail=f"server/discover failed: {exc.code} {exc.message}"
                                          ) from None
        else:
            verdict = discover_verdict(result)
            if verdict == "modern":
                return parse_discover_result(self.name, result)
        try:
            return await self._initialize()
        except UpstreamRpcError as exc:
            # A slow server may have taken the timed-out probe after all and now serves the modern era only.
            if exc.code != UNSUPPORTED_PROTOCOL_VERSION:
                raise
            return await self._discover(self._init_timeout)

    async def _initialize(self) -> UpstreamInfo:
        result = await self._rpc.call(INITIALIZE, initialize_params(__version__), timeout=self._init_timeout,
                                      on_message=None, transmit=self._transmit)
        info = parse_initialize_result(self.name, result)
        await self._rpc.notify(INITIALIZED)
        return info

    async def _discover(self, timeout: float) -> UpstreamInfo:
        result = await self._rpc.call(DISCOVER, envelope(None, __version__), timeout=timeout, on_message=None,
                                      transmit=self._transmit)
        return parse_discover_result(self.name, result)

    def _stop_listening(self) -> None:
        task, self._listening = self._listening, None
        if task is not None:
            task.cancel()

    async def _open_listen(self, handler: RelatedMessageHandler) -> dict[str, Any]:
        await self._supervisor.ready(self._init_timeout)
        method, params = listen_request()
        return await self._rpc.call(method, params, timeout=None, on_message=handler, transmit=self._transmit)

    async def _announce_restart(self) -> None:
        await self._rpc.on_notification(TOOLS_LIST_CHANGED, {})

    async def _stop(self, proc: Child) -> None:
        # The spec's order: EOF on stdin lets a well-behaved server finish; signals are for the others, and go to
        # its whole process group (what it left behind when it exits is killed then, see ``child``).
        stdin = proc.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                proc.signal(sig)
            if await proc.wait_exited(self._grace):
                break
        # Bastion's ends of the pipes are closed whoever else holds them (a helper that left the group).
        proc.release()
        await proc.wait()

    def _replace(self, proc: Child, detail: str) -> None:
        """End the connection to ``proc``, a child that runs but can no longer be talked to: requests in flight fail
        now, and the supervisor stops it (``_stop``) before it starts the next one. A child that exited is left to
        ``_read_stdout``, which reports its exit code. While the supervisor is still connecting, the attempt's own
        failure stops the child; should its handshake have succeeded, its health will fail and ``restart`` it."""
        if self._closing or proc is not self._proc or not self._supervisor.connected or proc.has_exited():
            return
        self._proc = None
        self._rpc.fail_all(detail)
        self._supervisor.lost(detail, cleanup=lambda: self._stop(proc))

    async def _watch_stdin(self, proc: Child) -> None:
        """A child that closed its stdin (a write to it then fails, and the pipe transport closes) can never be
        sent anything again. A server closing its stdin is usually on its way out: it gets the shutdown grace
        period to exit, which ends the connection with its exit code; one that still runs after it is replaced
        rather than left for its health to fail."""
        await proc.stdin_lost()
        if not await proc.wait_exited(self._grace):
            self._replace(proc, "stdin closed while the server runs")

    async def _watch_exit(self, proc: Child, reader: asyncio.Task[None]) -> None:
        """End the connection when the child exits, even if its stdout never reaches EOF: what it wrote before
        exiting is read first (``reader`` ends at EOF), within the shutdown grace period; then bastion's ends of
        the pipes are closed, which makes the reader see EOF, and the loss is handled there as any other."""
        await proc.wait_exited(None)
        await asyncio.wait({reader}, timeout=self._grace)
        proc.release()

    # -- framing ---------------------------------------------------------------------------------------------

    async def _transmit(self, pending: Pending) -> None:
        await self._write(pending.message)

    async def _write(self, message: dict[str, Any]) -> None:
        proc = self._proc
        stdin = proc.stdin if proc is not None else None
        if stdin is None:
            raise UpstreamUnavailable(self.name, log_detail="process not running")
        if stdin.is_closing():
            # The child closed it, or a write failed; ``_watch_stdin`` replaces a child that still runs.
            raise UpstreamUnavailable(self.name, log_detail="stdin closed")
        waiting = stdin.transport.get_write_buffer_size()
        if waiting >= STDIN_HIGH_WATER:
            # Perhaps a slow reader rather than a lost one: health decides (failed calls and probes, then restart).
            raise UpstreamUnavailable(self.name, log_detail=f"stdin not being read ({waiting} bytes waiting)")
        try:
            stdin.write(orjson.dumps(message) + b"\n")
            await stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise UpstreamUnavailable(self.name, log_detail=f"write to stdin failed: {exc!r}") from None

    async def _read_stdout(self, proc: Child) -> None:
        stdout = proc.stdout
        assert stdout is not None
        detail = "stdout closed"
        try:
            async for line in read_lines(stdout, self._limit):
                if line.isspace():
                    continue
                try:
                    message = orjson.loads(line)
                except orjson.JSONDecodeError:
                    self._rpc.noisy(log.warning, "upstream.bad_json", upstream=self.name, size=len(line))
                    continue
                await self._rpc.handle(message)
        except (ValueError, OSError) as exc:
            # LineTooLong (a ValueError): a line beyond max_message_bytes; the stream cannot be resynchronised.
            detail = f"stdout unreadable: {exc!r}"
        except Exception as exc:
            # A defect, not the child's doing; the child is restarted rather than left unread (and so unanswered).
            log.exception("upstream.stream_failed", upstream=self.name)
            detail = f"stdout reader failed: {type(exc).__name__}"
        if self._closing or proc is not self._proc:
            return
        self._proc = None
        proc.signal(signal.SIGKILL)  # stdout closed (or unreadable) while it runs: it cannot be talked to
        await proc.wait_exited(None)
        proc.release()
        code = await proc.wait()
        self._rpc.fail_all(f"{detail}; exit code {code}")
        self._supervisor.lost(f"{detail}; exit code {code}")

    async def _read_stderr(self, proc: Child) -> None:
        stderr = proc.stderr
        assert stderr is not None
        # Bounded: lines cut, rate-limited per upstream, escaped, read in chunks that yield (bastion.upstream.stderr).
        await pump_stderr(stderr, self._stderr_log)
