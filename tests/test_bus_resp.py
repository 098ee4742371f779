"""The bus's own RESP2 connections (``vdl_stream/bus_resp.py``): the codec without sockets
(round trips, an answer cut at every offset), then the connection against a real redis-server
(127.0.0.1, a port of its own): error answers in a pipeline, and a cancelled call."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from tests.test_bus import RedisServer
from vdl_stream import bus_resp


def answer(value) -> bytes:
    """``value`` as Redis would answer it (RESP2): bytes as a bulk string, None as a null."""
    if value is None:
        return b"$-1\r\n"
    if isinstance(value, bytes):
        return b"$%d\r\n%s\r\n" % (len(value), value)
    if isinstance(value, int):
        return b":%d\r\n" % value
    return b"*%d\r\n" % len(value) + b"".join(answer(v) for v in value)


values = st.recursive(
    st.none() | st.binary(max_size=40) | st.integers(-(2**63), 2**63 - 1),
    lambda inner: st.lists(inner, max_size=5),
    max_leaves=30,
)


@given(values)
def test_an_answer_parses_back_and_stops_being_complete_at_every_cut(value):
    data = answer(value) + b"+OK\r\n"  # the next answer after it is left alone
    parsed, end = bus_resp.parse(data)
    assert parsed == value
    assert data[end:] == b"+OK\r\n"
    for cut in range(len(data) - 5):
        with pytest.raises(bus_resp.Incomplete):
            bus_resp.parse(data[:cut])


def test_commands_are_arrays_of_bulk_strings_and_arguments_are_checked():
    assert bus_resp.encode("XADD", b"k", 7) == b"*3\r\n$4\r\nXADD\r\n$1\r\nk\r\n$1\r\n7\r\n"
    with pytest.raises(TypeError, match=r"bytes, str or int, got 1\.5"):
        bus_resp.encode("SET", 1.5)
    with pytest.raises(TypeError, match="got True"):
        bus_resp.encode("SET", True)


def test_simple_strings_errors_and_xread_answers():
    assert bus_resp.parse(b"+OK\r\n") == (b"OK", 5)
    error, _ = bus_resp.parse(b"-WRONGTYPE no\r\n")
    assert isinstance(error, bus_resp.ReplyError) and str(error) == "WRONGTYPE no"
    assert bus_resp.parse(b"*-1\r\n") == (None, 5)
    assert bus_resp.streams(None) == {}
    xread = answer([[b"k", [[b"1-0", [b"b", b"A", b"r", b"x"]], [b"2-0", []]]]])
    assert bus_resp.streams(bus_resp.parse(xread)[0]) == {
        b"k": [(b"1-0", {b"b": b"A", b"r": b"x"}), (b"2-0", {})]
    }
    with pytest.raises(ValueError):
        bus_resp.parse(b"?what\r\n")
    with pytest.raises(ValueError):
        bus_resp.streams(b"OK")


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path)
    try:
        yield server
    finally:
        server.stop()


async def test_a_pipeline_answers_in_order_with_an_error_in_its_place(redis_server):
    with trio.fail_after(10):
        redis = await bus_resp.open_connection(redis_server.url)
        big = b"x" * (3 * bus_resp.RECEIVE_BYTES)  # an answer over several reads
        replies = await redis.pipeline(
            [("SET", "s", big), ("XADD", "s", "*", "f", "v"), ("GET", "s"), ("INCR", "n")]
        )
        assert replies[0] == b"OK"
        assert isinstance(replies[1], bus_resp.ReplyError) and "WRONGTYPE" in str(replies[1])
        assert replies[2:] == [big, 1]
        with pytest.raises(bus_resp.ReplyError, match="WRONGTYPE"):
            await redis.call("XADD", "s", "*", "f", "v")
        assert await redis.call("INCR", "n") == 2  # still usable after an error answer
        await redis.aclose()


async def test_a_cancelled_call_closes_the_connection(redis_server):
    with trio.fail_after(10):
        redis = await bus_resp.open_connection(redis_server.url)
        with trio.move_on_after(0.2):  # cancelled while Redis holds the answer back
            await redis.call("BLPOP", "nothing", 5)
        with pytest.raises(ConnectionError):
            await redis.call("PING")  # its answer could be the BLPOP's: never read it


async def test_the_url_selects_the_database(redis_server):
    with trio.fail_after(10):
        one = await bus_resp.open_connection(redis_server.url.rsplit("/", 1)[0] + "/1")
        zero = await bus_resp.open_connection(redis_server.url)
        await one.call("SET", "k", "in 1")
        assert await zero.call("GET", "k") is None
        assert await one.call("GET", "k") == b"in 1"
        await one.aclose()
        await zero.aclose()
