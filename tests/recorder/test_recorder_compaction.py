"""Compaction changes how a run is stored, never what it reads back.

Every property test writes the same operations twice: into a run compacted after every few
records (so blocks are made and merged many times), and into a run never compacted. Every read
path must agree, and so must readers bounded by the positions a writer returned, and a follower
polling all along (nothing lost, nothing returned twice).
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recorder_testing import BASE_WALL, same_series

from recorder import RunReader, RunWriter
from recorder.blocks import parse_block_name
from recorder.catalog import OPEN_FILES

TAGS = ["a", "b", "c"]


@st.composite
def actions(draw) -> list[tuple]:
    """Scalar batches (some restarts), events of several kinds, flushes."""
    top = dict.fromkeys(TAGS, -1)
    out = []
    for _ in range(draw(st.integers(1, 60))):
        what = draw(st.sampled_from(["s", "s", "s", "e", "f", "f"]))
        if what == "s":
            tag = draw(st.sampled_from(TAGS))
            n = draw(st.one_of(st.integers(1, 4), st.integers(1, 300)))
            if top[tag] >= 0 and draw(st.integers(0, 5)) == 0:
                first = draw(st.integers(0, top[tag]))
            else:
                first = top[tag] + draw(st.integers(0, 2))
            top[tag] = max(top[tag], first + n - 1)
            out.append(("s", tag, first, n))
        elif what == "e":
            kind = draw(st.sampled_from(["text", "meta", "ingest", "histogram"]))
            tag = None if kind in ("meta", "ingest") else draw(st.sampled_from(["t", "h"]))
            step = draw(st.one_of(st.none(), st.integers(0, 50)))
            out.append(("e", kind, tag, step))
        else:
            out.append(("f",))
    return out


def apply(w: RunWriter, acts: list[tuple], on_flush=None) -> None:
    for i, act in enumerate(acts):
        if act[0] == "s":
            _, tag, first, n = act
            steps = np.arange(first, first + n)
            w.append_scalars(tag, steps, BASE_WALL + steps * 0.5, i * 1000.0 + np.arange(n))
        elif act[0] == "e":
            _, kind, tag, step = act
            w.append_record(kind, tag, step, BASE_WALL + i, {"i": i, "k": kind})
        else:
            pos = w.flush()
            if on_flush is not None:
                on_flush(pos)


def same_reads(x: RunReader, y: RunReader, limited: bool = False) -> None:
    """Two readers agree on every read path. Compaction keeps only the newest "ingest" record of
    a block: the newest one is the same for whole runs; a reader bounded inside a block may see
    an older one (the broker reads it from whole runs only)."""
    assert x.tags() == y.tags()
    for tag, info in x.tags().items():
        if info.kind == "scalars":
            assert same_series(x.read_scalars(tag), y.read_scalars(tag)), tag
            assert same_series(
                x.read_scalars(tag, start=10, end=200), y.read_scalars(tag, start=10, end=200)
            )
            a, b = x.read_scalars(tag, max_points=9), y.read_scalars(tag, max_points=9)
            assert same_series(a, b), tag
        else:
            assert x.read_records(tag=tag) == y.read_records(tag=tag), tag
    for kind in ("text", "meta", "histogram"):
        assert x.read_records(kind) == y.read_records(kind), kind
    assert [r for r in x.read_records() if r.kind != "ingest"] == [
        r for r in y.read_records() if r.kind != "ingest"
    ]
    assert x.meta == y.meta
    if not limited:
        assert x.last_record("ingest") == y.last_record("ingest")
    assert x.statistics().scalar_points == y.statistics().scalar_points
    assert per_tag(x.iter_records()) == per_tag(y.iter_records())
    assert per_tag(x.iter_records(from_step=20)) == per_tag(y.iter_records(from_step=20))


def per_tag(records) -> dict:
    """Records grouped by (kind, tag), each group in order; scalar chunks as their points
    (compaction merges chunks, so chunk boundaries differ) and ingest records left out."""
    out: dict = {}
    for r in records:
        if r.kind == "ingest":
            continue
        if r.kind == "scalars":
            out.setdefault(("scalars", r.tag), []).extend(
                zip(r.data.steps.tolist(), r.data.values.tolist(), strict=True)
            )
        else:
            out.setdefault((r.kind, r.tag), []).append((r.step, r.data))
    return out


settings_ = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@settings_
@given(actions(), st.integers(1, 6), st.integers(200, 3000), st.integers(1, 4))
def test_compaction_keeps_every_read_path_limits_and_followers(
    tmp_path_factory, acts, every, segment_bytes, poll_every
):
    root = tmp_path_factory.mktemp("c")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no damage may ever be reported
        wc = RunWriter(root / "c", sync="never", compact_records=every, segment_bytes=segment_bytes)
        wp = RunWriter(root / "p", sync="never", compact_records=None)
        follower: list[RunReader] = []
        polled: list = []
        c_pos, p_pos = [], []

        def follow(pos) -> None:
            c_pos.append(pos)
            if not follower:
                follower.append(RunReader(root / "c"))
                polled.extend(follower[0].iter_records())
            elif len(c_pos) % poll_every == 0:  # a slow follower falls inside sealed segments
                polled.extend(follower[0].poll())

        apply(wc, acts, follow)
        apply(wp, acts, p_pos.append)
        wc.flush()
        wp.flush()
        same_reads(RunReader(root / "c"), RunReader(root / "p"))  # live: blocks and tail
        if follower:
            polled.extend(follower[0].poll())
            want = per_tag(RunReader(root / "p").iter_records())
            assert per_tag(polled) == want  # each record exactly once
            assert follower[0].position() <= wc.position()
        for a, b in zip(c_pos, p_pos, strict=True):  # limits now inside blocks
            same_reads(RunReader(root / "c", limit=a), RunReader(root / "p", limit=b), True)
        wc.close()
        wp.close()
        same_reads(RunReader(root / "c"), RunReader(root / "p"))
        # A reopened writer appends after the blocks; its first segment is read back from disk.
        wc = RunWriter(root / "c", sync="never", compact_records=every, segment_bytes=segment_bytes)
        wp = RunWriter(root / "p", sync="never", compact_records=None)
        apply(wc, acts[: len(acts) // 2])
        apply(wp, acts[: len(acts) // 2])
        wc.close()
        wp.close()
        same_reads(RunReader(root / "c"), RunReader(root / "p"))
        if follower:
            polled.extend(follower[0].poll())
            assert per_tag(polled) == per_tag(RunReader(root / "p").iter_records())
            follower[0].close()


def write_live(path, flushes: int, every: int = 8, **kw) -> RunWriter:
    w = RunWriter(path, sync="never", compact_records=every, **kw)
    for i in range(flushes):
        w.append_scalars("x", [i], [BASE_WALL + i * 0.02], [float(i)])
        w.append_scalars("y", [i], [BASE_WALL + i * 0.02], [-float(i)])
        w.append_record("ingest", None, None, BASE_WALL + i * 0.02, {"w": i})
        w.flush()
    return w


def test_a_live_run_compacts_into_few_records_and_merges_levels(tmp_path):
    w = write_live(tmp_path / "r", 2000)
    stats = w.statistics()
    assert stats.compactions > 100 and stats.merges > 10
    names = os.listdir(tmp_path / "r")
    assert len([n for n in names if parse_block_name(n)]) < 20
    with RunReader(tmp_path / "r") as r:
        assert r.statistics().records < 200  # instead of 4,000
        assert r.read_scalars("x").steps.tolist() == list(range(2000))
        assert r.last_record("ingest").data == {"w": 1999}
        info = r.tags()["y"]
        assert (info.count, info.vmin, info.vmax) == (2000, -1999.0, 0.0)
    w.close()
    with RunReader(tmp_path / "r") as r:
        assert r.read_scalars("y").values.tolist() == [-float(i) for i in range(2000)]
        assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path / "r"))


def test_a_reader_holds_a_bounded_number_of_files(tmp_path):
    w = write_live(tmp_path / "r", 3000, every=4, segment_bytes=600)
    with RunReader(tmp_path / "r") as r:
        r.read_scalars("x")
        r.read_records("ingest")
        list(r.iter_records())
        assert r._catalog.open_files() <= OPEN_FILES + 1
        follower = RunReader(tmp_path / "r")
        catalog = follower._catalog
        for i in range(3000, 3400):
            w.append_scalars("x", [i], [BASE_WALL], [1.0])
            w.flush()
            follower.poll()
        assert w.statistics().compactions > 50
        # It read each sealed segment whole before it was compacted: it took the blocks as read.
        assert follower._catalog is catalog
        assert follower._catalog.open_files() <= OPEN_FILES + 1
        assert follower.read_scalars("x").steps.tolist() == list(range(3400))
        follower.close()
    w.close()


def test_a_follower_keeps_up_while_the_writer_compacts(tmp_path):
    w = RunWriter(tmp_path / "r", sync="never", compact_records=3)
    f = RunReader(tmp_path / "r")
    got = []
    for i in range(500):
        w.append_scalars("x", [i], [BASE_WALL], [float(i)])
        if i % 7 == 0:
            w.append_record("text", "t", i, BASE_WALL, {"i": i})
        w.flush()
        if i % 13 == 0:  # a slow follower: several compactions between polls
            got.extend(f.poll())
    got.extend(f.poll())
    steps = [s for r in got if r.kind == "scalars" for s in r.data.steps.tolist()]
    assert steps == list(range(500))
    assert [r.step for r in got if r.kind == "text"] == list(range(0, 500, 7))
    w.close()
    f.close()


def test_bad_compact_records_is_refused(tmp_path):
    with pytest.raises(ValueError, match="compact_records must be None or an int >= 1, got 0"):
        RunWriter(tmp_path / "r", compact_records=0)


def test_block_file_layout_matches_the_documented_bytes(tmp_path):
    import struct
    import zlib

    import msgpack

    from recorder import framing

    w = write_live(tmp_path / "r", 20, every=4)
    w.close()
    names = sorted(n for n in os.listdir(tmp_path / "r") if parse_block_name(n))
    blob = (tmp_path / "r" / names[0]).read_bytes()
    assert blob[:8] == b"\x89VDLBLK\n"
    version, first, created, last, crc = struct.unpack_from("<IIdII", blob, 8)
    assert (version, (first, last)) == (2, parse_block_name(names[0]))
    assert crc == zlib.crc32(blob[:28]) and created > 1e9
    offset, size, tcrc, magic = struct.unpack_from("<QII8s", blob, len(blob) - 24)
    assert magic == b"VDLBEND\n" and tcrc == zlib.crc32(blob[-24:-12])
    assert offset + size == len(blob) - 24
    footer = msgpack.unpackb(framing.check_frame(blob[offset : offset + size]))
    assert footer["version"] == 3 and footer["segments"][0][0] == first
    c = footer["chunks"]
    for i, tag in enumerate(c["tag"]):  # every chunk is where the footer says, with its summary
        payload = framing.check_frame(blob[c["offset"][i] : c["offset"][i] + 12 + c["length"][i]])
        kind, ptag, step, _, data = msgpack.unpackb(payload)
        assert (kind, ptag, step, data["n"]) == ("scalars", tag, c["first_step"][i], c["count"][i])
        assert data["k"] == data["n"]  # one point per flush: one piece per point
        assert c["finite"][i] is True and c["vmin_step"][i] is not None
        assert payload == msgpack.packb(msgpack.unpackb(payload))  # plain msgpack, as packb
        # The level-of-detail frame follows the chunk, and locates its columns in the payload.
        assert c["lod_offset"][i] == c["offset"][i] + 12 + c["length"][i]
        frame = blob[c["lod_offset"][i] : c["lod_offset"][i] + 12 + c["lod_length"][i]]
        lod = msgpack.unpackb(framing.check_frame(frame))
        n = data["n"]
        assert (lod["S"], lod["n"]) == (256, n)
        assert payload[lod["cv"] : lod["cv"] + 8 * n] == data["v"]
        assert lod["cs"] == data["s"] == ["range", step, 1]
        assert lod["cw"][:2] == data["w"][:2] == ["us", data["w"][1]]
        assert payload[lod["cw"][2] : lod["cw"][2] + 4 * n] == data["w"][2]
        assert zlib.crc32(data["v"]) == struct.unpack("<I", lod["crc"])[0]  # one slice
        assert zlib.crc32(data["w"][2]) == struct.unpack("<I", lod["crcsw"])[0]
        values = np.frombuffer(data["v"], "<f8")
        assert struct.unpack("<I", lod["imin"])[0] == values.argmin()
        assert struct.unpack("<d", lod["vmax"])[0] == values.max()
    assert footer["events"]["kind"] == ["ingest"]  # collapsed to the newest


def test_a_damaged_block_is_a_format_error_naming_the_file(tmp_path):
    from recorder import FormatError

    write_live(tmp_path / "r", 40, every=4).close()
    name = sorted(n for n in os.listdir(tmp_path / "r") if parse_block_name(n))[0]
    path = tmp_path / "r" / name
    blob = bytearray(path.read_bytes())
    blob[-30] ^= 0xFF  # inside the footer
    path.write_bytes(bytes(blob))
    with pytest.raises(FormatError, match=name):
        RunReader(tmp_path / "r")
    with pytest.raises(FormatError, match=name):
        RunWriter(tmp_path / "r")


@pytest.mark.parametrize("close", [False, True])
def test_a_limited_read_of_events_picks_what_thinning_all_of_them_picks(tmp_path, close):
    """read_records(limit=) decodes only the picked events of a block's batches, and picks the
    same records as spreading ``limit`` picks over the whole history."""
    w = RunWriter(tmp_path / "r", sync="never", compact_records=8)
    for i in range(3000):
        wall = BASE_WALL + i * 0.02
        w.append_scalars("x", [i], [wall], [float(i)])
        if i % 3 == 0:
            w.append_record("histogram", "h", i, wall, {"counts": [i]})
            w.append_record("telemetry", None, None, wall, {"fields": {"cpu": float(i)}})
        w.append_record("ingest", None, None, wall, {"w": i})
        w.flush()
    if close:
        w.close()
    with RunReader(tmp_path / "r") as r:
        assert any(parse_block_name(n) for n in os.listdir(tmp_path / "r"))  # compacted
        for kind, tag in (("histogram", "h"), ("telemetry", None)):
            every = r.read_records(kind, tag)
            assert len(every) == 1000
            for limit in (1, 2, 7, 100, 999, 1000, 5000):
                picked = (
                    np.linspace(0, 999, limit).round().astype(int) if limit < 1000 else range(1000)
                )
                want = [every[i] for i in picked]
                got = r.read_records(kind, tag, limit=limit)
                assert [(g.step, g.wall, g.data) for g in got] == [
                    (x.step, x.wall, x.data) for x in want
                ], (kind, limit)
        with pytest.raises(ValueError, match="limit must be a positive int"):
            r.read_records("histogram", "h", limit=0)
    if not close:
        w.close()
