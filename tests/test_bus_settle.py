"""The bus publishes a batch at ingest, before it is written: what the receivers do about it.

No Redis here: the publishing side's queue and the receiving side's fan-out are driven directly
with the records a publish round builds (``_coalesce``, ``_round_fields`` and ``_records``, the
functions the publish and read loops use), into a real in-process
:class:`~vdl_stream.broker.Broker` and its subscriber.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import trio

from tests.conftest import wait_until
from vdl_stream import codec
from vdl_stream.broker import Broker
from vdl_stream.bus import UNSETTLED_SECONDS, Bus, Record, _coalesce, _records, _round_fields
from vdl_stream.codec import Batch, ScalarColumns

NOWHERE = "redis://127.0.0.1:1/0"  # never connected: these tests drive the bus by hand


def batch(run: str, seq: int) -> Batch:
    steps = np.arange(seq * 10, seq * 10 + 10, dtype=np.int64)
    return Batch("w", seq, run, [ScalarColumns("loss", steps, steps * 1.0, steps * 2.0)], [])


def entries_of(source: str, items: list, written: int) -> list[Record]:
    """The records one publish round of broker ``source`` adds for ``items``, as a receiver
    reads them back from the round's entry (bytes fields, as Redis returns them)."""
    _, entries = _coalesce(items)
    fields = _round_fields(source, entries, {run: written for run, _, _, _ in entries})
    return [record for _, record in _records(as_read(fields), 1.0)]


def as_read(fields: dict) -> dict[bytes, bytes]:
    """A stream entry's fields as coredis returns them."""
    return {k.encode(): (v if isinstance(v, bytes) else str(v).encode()) for k, v in fields.items()}


def steps_of(bus: Bus, run: str) -> list[int]:
    return [int(s) for scalars, _ in bus.unsettled(run) for c in scalars for s in c.steps]


async def drain(sub) -> list[dict]:
    """Every frame the subscriber has ready (decoded), without waiting."""
    frames = []
    while True:
        try:
            frames.append(codec.decode_message(sub.receive_nowait()))
        except trio.WouldBlock:
            return frames


async def test_a_published_batch_is_settled_in_order_and_a_refused_one_is_retracted(
    tmp_path: Path,
):
    broker = Broker(tmp_path)
    bus = Bus(broker, NOWHERE)
    for seq in (1, 2, 3):
        bus.publish(batch("r", seq))
    bus.settled("r")
    bus.settled("r", refused=True)  # batch 2 was refused after its fan-out
    items = []
    while True:
        try:
            items.append(bus._receive.receive_nowait())
        except trio.WouldBlock:
            break
    assert [(run, n) for run, n, _ in items] == [("r", 1), ("r", 2), ("r", 3), ("r", -1)]
    assert bus._written["r"] == 2  # the last batch reported: refused, but done with
    _, entries = _coalesce(items)
    # the batches in one entry, then the retraction after them
    assert [(run, m, n) for run, m, n, _ in entries] == [("r", 1, 3), ("r", 0, 0)]
    fields = _round_fields("A", entries, {"r": 2})
    assert [(run, r.source, r.m, r.n, r.written) for run, r in _records(as_read(fields), 1.0)] == [
        ("r", b"A", 1, 3, 2),
        ("r", b"A", 0, 0, 2),
    ]


async def test_receivers_keep_unwritten_frames_resend_them_after_a_snapshot_and_resync_a_retracted_run(
    tmp_path: Path,
):
    broker = Broker(tmp_path)
    bus = Bus(broker, NOWHERE)
    sub = broker.subscribe()
    # Broker A published batches 1 and 2 at ingest, in two rounds; when it added the second
    # only batch 1 was written. (A round merging both would keep both: an entry is kept whole.)
    one = entries_of("A", [("r", 1, batch("r", 1))], 0)
    two = entries_of("A", [("r", 2, batch("r", 2))], 1)
    bus._fan_out("r", one + two)
    assert steps_of(bus, "r") == list(range(20, 30))  # batch 2 may not be in the files yet
    live = [f for f in await drain(sub) if f["type"] == "data"]
    assert [s for f in live for s in np.frombuffer(f["scalars"][0][1], "<f8")] == list(
        range(10, 30)
    )
    # A snapshot read from the files now may lack batch 2: it is offered again after it.
    broker._bus_resend(sub, "r")
    again = [f for f in await drain(sub) if f["type"] == "data"]
    assert [s for f in again for s in np.frombuffer(f["scalars"][0][1], "<f8")] == list(
        range(20, 30)
    )
    # Batch 3 arrives with batch 2 written: only 3 is kept.
    bus._fan_out("r", entries_of("A", [("r", 3, batch("r", 3))], 2))
    assert steps_of(bus, "r") == list(range(30, 40))
    assert sub.statistics().run_gaps == 0
    # Batch 3 was refused after all: a retraction; the subscriber re-syncs the run, and
    # nothing of it is sent again after that snapshot.
    bus._fan_out("r", entries_of("A", [("r", -1, b"")], 3))
    assert sub.statistics().run_gaps == 1
    assert bus.unsettled("r") == []


async def test_another_broker_taking_a_run_over_resyncs_frames_the_previous_one_never_wrote(
    tmp_path: Path,
):
    broker = Broker(tmp_path)
    bus = Bus(broker, NOWHERE)
    sub = broker.subscribe()
    bus._fan_out("r", entries_of("A", [("r", 1, batch("r", 1))], 0))  # A dies before writing it
    assert sub.statistics().run_gaps == 0
    bus._fan_out("r", entries_of("C", [("r", 1, batch("r", 1))], 0))  # C took the run over
    assert sub.statistics().run_gaps == 1  # the page reads the run again from the files
    assert steps_of(bus, "r") == list(range(10, 20))  # C's copy, kept until C writes it
    # A run that changed brokers with everything written re-syncs nothing.
    bus._fan_out("s", entries_of("A", [("s", 1, batch("s", 1))], 1))
    bus._fan_out("s", entries_of("C", [("s", 1, batch("s", 2))], 1))
    assert sub.statistics().run_gaps == 1


async def test_unsettled_frames_are_forgotten_after_a_few_seconds(tmp_path: Path):
    broker = Broker(tmp_path)
    bus = Bus(broker, NOWHERE)
    bus._fan_out("r", entries_of("A", [("r", 1, batch("r", 1))], 0))
    assert steps_of(bus, "r") == list(range(10, 20))
    bus._sweep(time.monotonic())
    assert "r" in bus._unsettled  # still young
    sub = broker.subscribe()
    bus._sweep(time.monotonic() + UNSETTLED_SECONDS + 1)  # its broker never said it wrote them
    assert "r" not in bus._unsettled and bus.unsettled("r") == []
    # They can no longer be sent again after a snapshot: the subscribers re-sync the run now.
    assert sub.statistics().run_gaps == 1


async def test_frames_pushed_out_unsettled_resync_the_run(tmp_path: Path):
    """Past UNSETTLED_KEPT frames, or past UNSETTLED_SECONDS on the next entry, unsettled frames
    could no longer be offered after a snapshot: every one is dropped and the run re-synced."""
    from vdl_stream.bus import UNSETTLED_KEPT

    broker = Broker(tmp_path)
    bus = Bus(broker, NOWHERE)
    sub = broker.subscribe()
    for seq in range(1, UNSETTLED_KEPT + 1):  # its broker is far behind: nothing written
        bus._fan_out("r", entries_of("A", [("r", seq, batch("r", seq))], 0))
    assert len(bus.unsettled("r")) == UNSETTLED_KEPT
    await drain(sub)
    assert sub.statistics().run_gaps == 0
    more = UNSETTLED_KEPT + 1
    bus._fan_out("r", entries_of("A", [("r", more, batch("r", more))], 0))
    assert sub.statistics().run_gaps == 1
    assert steps_of(bus, "r") == list(range(more * 10, more * 10 + 10))  # the new one alone
    # Too old, found on the next entry (before the once-a-second sweep).
    await drain(sub)  # the page re-synced
    _source, held = bus._unsettled["r"]
    n, at, scalars, events = held[0]
    held[0] = (n, at - UNSETTLED_SECONDS - 1, scalars, events)
    bus._fan_out("r", entries_of("A", [("r", more + 1, batch("r", more + 1))], 0))
    assert sub.statistics().run_gaps == 2
    assert steps_of(bus, "r") == list(range((more + 1) * 10, (more + 1) * 10 + 10))


async def test_the_trace_summary_is_computed_off_the_event_loop(monkeypatch, tmp_path: Path):
    """With tracing on, ``statistics()`` (what ``/api/stats`` reads) returns the last summary; the
    numpy work runs in a worker thread, never on the event loop."""
    import threading

    from vdl_stream import bus_trace

    threads: list[threading.Thread] = []
    summarize = bus_trace.summary

    def spy(*args):
        threads.append(threading.current_thread())
        return summarize(*args)

    monkeypatch.setattr(bus_trace, "ON", True)
    monkeypatch.setattr(bus_trace, "summary", spy)
    monkeypatch.setattr(bus_trace, "SUMMARY_INTERVAL", 0.05, raising=False)
    monkeypatch.setattr(bus_trace, "_latest", None, raising=False)
    bus_trace.age("2_published", np.array([time.time()]))
    bus = Bus(Broker(tmp_path), NOWHERE)
    loop = threading.current_thread()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bus_trace.watch_loop)
            assert bus.statistics().stages is None  # nothing summarized yet, nothing computed
            await wait_until(lambda: bus.statistics().stages is not None, 5, "a summary")
            nursery.cancel_scope.cancel()
    assert "2_published" in bus.statistics().stages
    assert threads and all(t is not loop for t in threads)


def test_an_entry_frame_decodes_as_its_checked_batch_and_a_malformed_one_is_refused():
    """Receivers decode entries with ``codec.decode_checked_batch`` (their shape only: the
    publishing broker checked every value at ingest); it gives what ``decode_batch`` gives."""
    import pytest

    one = batch("r", 3)
    one.scalars.append(
        ScalarColumns("acc", one.scalars[0].steps, one.scalars[0].walls, -one.scalars[0].values)
    )
    one.events.append({"kind": "text", "tag": "t", "step": 3, "wall": 1.5, "text": "x"})
    message = codec.decode_message(codec.encode_batch(one))
    fast, full = codec.decode_checked_batch(message), codec.decode_batch(message)
    assert (fast.writer, fast.seq, fast.run, fast.events) == (
        full.writer,
        full.seq,
        full.run,
        full.events,
    )
    for a, b in zip(fast.scalars, full.scalars, strict=True):
        assert a.tag == b.tag
        for x, y in ((a.steps, b.steps), (a.walls, b.walls), (a.values, b.values)):
            assert x.dtype == y.dtype and x.tolist() == y.tolist()
    bad = [
        {**message, "scalars": [["loss", b"1234567", b"", b""]]},  # not 8-byte elements
        {**message, "scalars": [["loss", b"", b""]]},  # a column missing
        {**message, "scalars": [["loss", bytes(8), bytes(16), bytes(8)]]},  # lengths differ
        {k: v for k, v in message.items() if k != "run"},
        {**message, "events": [3]},
    ]
    for broken in bad:
        with pytest.raises(codec.ProtocolError):
            codec.decode_checked_batch(broken)
