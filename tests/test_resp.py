"""The lean Redis client (``bastion.resp``): the wire format, and a real redis-server killed, frozen and restarted.

The client serves the rate limiter's scripts on a single server; these tests hold it to redis-py's behaviour where
the limiter depends on it (exceptions, one retry after a dead connection, a silent server timing out) and to the
one thing it adds: many callers on one connection, each answered with its own reply.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.exceptions import AuthenticationError, DataError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bastion.redisconn import ClientOptions, RedisClients, open_lean
from bastion.resp import (
    ErrorReply,
    Incomplete,
    LeanRedis,
    LeanTarget,
    ProtocolViolation,
    encode_command,
    parse_reply,
)
from tests.support.net import free_port
from tests.support.redis_server import RedisServer

FAST = ClientOptions(socket_timeout_s=5.0, connect_timeout_s=2.0)


def lean(url: str, options: ClientOptions = FAST) -> LeanRedis:
    client = open_lean(url, options)
    assert client is not None
    return client


@pytest.fixture
async def client(private_redis: RedisServer) -> AsyncIterator[LeanRedis]:
    c = lean(private_redis.url)
    yield c
    await c.aclose()


@pytest.fixture
async def admin(private_redis: RedisServer) -> AsyncIterator[Redis]:
    c = Redis.from_url(private_redis.url)
    yield c
    await c.aclose()


# -- the wire format ------------------------------------------------------------------------------------------


def test_commands_are_encoded_as_redis_py_encodes_them() -> None:
    assert encode_command(("SET", "k", "vé")) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\xc3\xa9\r\n"
    assert encode_command(("EVALSHA", "ab", 2, b"\x00\r\n", -7, 1.5)) == (
        b"*6\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n2\r\n$3\r\n\x00\r\n\r\n$2\r\n-7\r\n$3\r\n1.5\r\n")
    with pytest.raises(DataError):
        encode_command(("SET", "k", True))
    with pytest.raises(DataError):
        encode_command(("SET", "k", None))  # type: ignore[arg-type]


class _Word(str):
    pass


class _Count(int):
    pass


_ARG = st.one_of(st.text(), st.binary(), st.integers(min_value=-(2**70), max_value=2**70),
                 st.floats(allow_nan=False), st.text().map(_Word), st.integers().map(_Count))


@given(st.lists(_ARG, max_size=20))
def test_any_command_is_encoded_byte_for_byte_as_redis_py_encodes_it(args: list[str | bytes | int | float]) -> None:
    # The exact-type shortcuts and the isinstance chain behind them must agree with redis-py for subclasses too.
    # (redis-py treats the command name apart, so it is a fixed one here.)
    assert encode_command(["EVALSHA", *args]) == b"".join(Connection().pack_command("EVALSHA", *args))


REPLIES = [
    (b"+OK\r\n", "OK"),
    (b":-42\r\n", -42),
    (b"$5\r\nhe\r\nl\r\n", b"he\r\nl"),
    (b"$0\r\n\r\n", b""),
    (b"$-1\r\n", None),
    (b"*-1\r\n", None),
    (b"*0\r\n", []),
    (b"*4\r\n:1\r\n:0\r\n:0\r\n:1764250000000000\r\n", [1, 0, 0, 1764250000000000]),
    (b"*2\r\n*1\r\n$1\r\na\r\n-ERR inner\r\n", [[b"a"], ErrorReply("ERR inner")]),
    (b"-NOSCRIPT No matching script.\r\n", ErrorReply("NOSCRIPT No matching script.")),
]


@pytest.mark.parametrize(("wire", "value"), REPLIES)
def test_every_reply_type_parses_whole_and_is_incomplete_when_cut_anywhere(wire: bytes, value: object) -> None:
    assert parse_reply(wire) == (value, len(wire))
    assert parse_reply(b"junk" + wire + b"+next\r\n", 4) == (value, 4 + len(wire))
    for cut in range(len(wire)):
        with pytest.raises(Incomplete):
            parse_reply(wire[:cut])


@pytest.mark.parametrize("wire", [b"?what\r\n", b":12x\r\n", b"$3\r\nabcde\r\n", b"*1\r\n" * 40 + b":1\r\n"])
def test_bytes_that_are_not_resp2_are_refused(wire: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        parse_reply(wire)


@pytest.mark.parametrize(("url", "target"), [
    ("redis://127.0.0.1:6380/0", LeanTarget(host="127.0.0.1", port=6380)),
    ("redis://localhost", LeanTarget(host="localhost")),
    ("redis://:p%40ss@h:1/3", LeanTarget(host="h", port=1, password="p@ss", db=3)),
    ("redis://bob:pw@[::1]:7000/", LeanTarget(host="::1", port=7000, username="bob", password="pw")),
    ("rediss://cache.internal:6380/1", LeanTarget(host="cache.internal", port=6380, tls=True, db=1)),
    ("unix:///run/redis.sock", LeanTarget(path="/run/redis.sock")),
    # Left to redis-py: options this client does not read, and every shape that is not one server.
    ("redis://h:1/0?ssl_cert_reqs=none", None),
    ("unix:///run/redis.sock?db=2", None),
    ("redis://h/zero", None),
    ("redis://h:99999", None),
    ("redis+sentinel://h:26379/mymaster", None),
    ("redis+cluster://h:7000,h:7001", None),
    ("http://h:6379", None),
])
def test_only_urls_read_exactly_as_redis_py_reads_them_get_the_lean_client(url: str,
                                                                            target: LeanTarget | None) -> None:
    assert LeanTarget.parse(url) == target
    if url.startswith("redis+"):
        assert open_lean(url, FAST) is None


# -- a real server --------------------------------------------------------------------------------------------


async def test_commands_scripts_and_noscript_map_to_redis_py_results(client: LeanRedis) -> None:
    assert await client.ping() == "PONG"
    assert await client.execute("SET", "k", "v") == "OK"
    assert await client.execute("GET", "k") == b"v"
    assert await client.execute("GET", "missing") is None
    source = "return {tonumber(ARGV[1]) + 1, KEYS[1]}"
    sha = "0" * 40
    with pytest.raises(NoScriptError):
        await client.evalsha(sha, 1, "key", 41)
    sha = (await client.script_load(source)).decode()
    assert await client.evalsha(sha, 1, "key", 41) == [42, b"key"]
    with pytest.raises(ResponseError, match="not an integer"):
        await client.execute("INCR", "k")
    # The connection survived the error replies.
    assert await client.execute("INCR", "n") == 1


async def test_many_callers_on_one_connection_each_get_their_own_reply(client: LeanRedis, admin: Redis) -> None:
    async def one(i: int) -> bytes | None:
        await client.execute("SET", f"key:{i}", f"value:{i}")
        result: bytes | None = await client.execute("GET", f"key:{i}")
        return result

    results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(300))), 30)
    assert results == [f"value:{i}".encode() for i in range(300)]
    # One connection carried all of it (plus the admin's own).
    clients = (await admin.execute_command("CLIENT", "LIST")).decode().strip().splitlines()
    assert len(clients) == 2


async def test_a_caller_that_gives_up_leaves_its_reply_behind_not_to_the_next_caller(
        private_redis: RedisServer, client: LeanRedis) -> None:
    await client.execute("SET", "a", "for-a")
    await client.execute("SET", "b", "for-b")
    with private_redis.frozen(), pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await client.execute("GET", "a")
    # Well within socket_timeout (5 s): the connection is kept, and the reply to "GET a" is read and dropped.
    assert await asyncio.wait_for(client.execute("GET", "b"), 10) == b"for-b"


async def test_a_restart_costs_no_failed_command(private_redis: RedisServer, client: LeanRedis) -> None:
    assert await client.execute("INCR", "n") == 1
    private_redis.kill()
    private_redis.start()
    # The connection is dead; every caller on it is sent once more on a new one.
    results = await asyncio.wait_for(asyncio.gather(*(client.execute("INCR", "n") for _ in range(20))), 10)
    assert sorted(results) == list(range(1, 21))


async def test_a_command_fails_fast_with_connection_error_while_redis_is_down(private_redis: RedisServer,
                                                                             client: LeanRedis) -> None:
    await client.ping()
    private_redis.kill()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(RedisConnectionError):
        await asyncio.wait_for(client.ping(), 10)
    assert loop.time() - started < 2.0
    private_redis.start()
    assert await asyncio.wait_for(client.ping(), 10) == "PONG"


async def test_a_silent_server_times_out_its_callers_and_the_next_call_gets_a_new_connection(
        private_redis: RedisServer, admin: Redis) -> None:
    client = lean(private_redis.url, ClientOptions(socket_timeout_s=0.3, connect_timeout_s=0.3))
    try:
        first = await client.execute("CLIENT", "ID")
        with private_redis.frozen(), pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await client.ping()
        second = await asyncio.wait_for(client.execute("CLIENT", "ID"), 10)
        assert second != first
    finally:
        await client.aclose()


async def test_a_silent_server_fails_a_waiting_caller_once_socket_timeout_passed(private_redis: RedisServer) -> None:
    """The caller that finds the oldest command unanswered past socket_timeout closes the connection: everyone on
    it gets TimeoutError (as redis-py's read timeout gives), and that caller retries once on a new connection."""
    client = lean(private_redis.url, ClientOptions(socket_timeout_s=0.2, connect_timeout_s=0.2, retries=0))
    try:
        await client.ping()
        with private_redis.frozen():
            waiting = asyncio.ensure_future(client.ping())
            await asyncio.sleep(0.3)
            late = asyncio.ensure_future(client.ping())
            with pytest.raises(RedisTimeoutError):
                await asyncio.wait_for(waiting, 5)
        # The late caller opened a new connection (the kernel completes the handshake for a stopped Redis) and is
        # answered on it once Redis runs again.
        assert await asyncio.wait_for(late, 5) == "PONG"
    finally:
        await client.aclose()


async def test_an_idle_connection_is_replaced_before_use(private_redis: RedisServer) -> None:
    client = lean(private_redis.url, ClientOptions(socket_timeout_s=1.0, connect_timeout_s=1.0,
                                                   health_check_interval_s=0))
    try:
        first = await client.execute("CLIENT", "ID")
        await asyncio.sleep(0.05)
        assert await client.execute("CLIENT", "ID") != first
    finally:
        await client.aclose()


async def test_auth_and_select_run_first_and_a_wrong_password_is_an_authentication_error(
        private_redis: RedisServer, admin: Redis) -> None:
    await admin.execute_command("ACL", "SETUSER", "bob", "on", ">s3cret", "~*", "+@all")
    port = private_redis.port
    client = lean(f"redis://bob:s3cret@127.0.0.1:{port}/2")
    try:
        assert await client.execute("SET", "where", "db2") == "OK"
        assert await client.execute("ACL", "WHOAMI") == b"bob"
    finally:
        await client.aclose()
    assert await admin.get("where") is None
    db2 = Redis.from_url(f"redis://127.0.0.1:{port}/2")
    try:
        assert await db2.get("where") == b"db2"
    finally:
        await db2.aclose()
    wrong = lean(f"redis://bob:nope@127.0.0.1:{port}/0")
    try:
        with pytest.raises(AuthenticationError):
            await wrong.ping()
    finally:
        await wrong.aclose()


async def test_a_peer_that_does_not_speak_resp_is_a_connection_error() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)
        writer.close()

    port = free_port()
    server = await asyncio.start_server(garbage, "127.0.0.1", port)
    client = lean(f"redis://127.0.0.1:{port}", ClientOptions(socket_timeout_s=1.0, connect_timeout_s=1.0,
                                                             retries=0))
    try:
        with pytest.raises(RedisConnectionError, match="Protocol error"):
            await asyncio.wait_for(client.ping(), 5)
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()


async def test_the_gateway_clients_give_the_limiter_a_lean_client_on_a_single_server_only(
        private_redis: RedisServer) -> None:
    clients = RedisClients.open(private_redis.url, limiter_timeout_s=0.25)
    try:
        assert clients.limiter_scripts is not None
        assert clients.limiter_scripts.socket_timeout == 0.25
        assert await clients.warm()
    finally:
        await clients.aclose()
    escape = RedisClients.open(private_redis.url, limiter_timeout_s=0.25, lean=False)
    try:
        assert escape.limiter_scripts is None
    finally:
        await escape.aclose()


async def test_closing_the_client_during_a_connect_fails_its_callers_with_a_connection_error() -> None:
    """``aclose`` cancels a connect in progress (here: AUTH to a peer that never answers); the callers waiting for
    it get ConnectionError, not a cancellation they never asked for."""
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1000)
        await asyncio.sleep(5)
        writer.close()

    port = free_port()
    server = await asyncio.start_server(silent, "127.0.0.1", port)
    client = lean(f"redis://:pw@127.0.0.1:{port}", ClientOptions(socket_timeout_s=5.0, connect_timeout_s=5.0))
    try:
        waiting = asyncio.ensure_future(client.ping())
        await asyncio.sleep(0.2)
        await client.aclose()
        with pytest.raises(RedisConnectionError, match="client closed"):
            await asyncio.wait_for(waiting, 5)
    finally:
        server.close()
        await server.wait_closed()


async def test_commands_issued_in_one_turn_of_the_loop_reach_redis_in_one_read(client: LeanRedis,
                                                                              admin: Redis) -> None:
    """Under load many calls ask at once: their commands leave in one write, so Redis reads them with one system
    call (``total_reads_processed``) instead of one each."""
    await client.ping()

    async def reads() -> int:
        return int((await admin.info("stats"))["total_reads_processed"])

    before = await reads()
    results = await asyncio.gather(*(client.execute("INCR", "burst") for _ in range(100)))
    after = await reads()
    assert sorted(results) == list(range(1, 101))
    # The admin's own INFO is one read; the hundred commands are one more (two if the kernel split the write).
    assert after - before <= 3
