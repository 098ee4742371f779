"""The broker's persist step: a live batch's scalars go to the recorder in one call
(RunWriter.append_scalar_batch), and read back as the per-tag path wrote them."""

from __future__ import annotations

import numpy as np
import trio

import recorder
from vdl_stream import broker as broker_module
from vdl_stream.broker import Broker
from vdl_stream.codec import Batch, ScalarColumns


def _columns(k: int) -> list[ScalarColumns]:
    """Ten tags of a point each, some of other dtypes than the recorder's, and an empty one."""
    cols = []
    for i in range(10):
        steps = np.array([k], np.uint64 if i == 3 else np.int64)
        values = np.array([k + i / 8], np.float32 if i == 5 else np.float64)
        cols.append(ScalarColumns(f"m{i}", steps, np.array([1.7e9 + k]), values))
    cols.append(ScalarColumns("empty", np.array([]), np.array([]), np.array([])))
    return cols


async def test_a_live_batch_is_persisted_in_one_recorder_call(tmp_path, monkeypatch):
    calls = {"batch": 0, "tag": 0}
    batch_append = recorder.RunWriter.append_scalar_batch
    tag_append = recorder.RunWriter.append_scalars

    def counted_batch(self, *args):
        calls["batch"] += 1
        return batch_append(self, *args)

    def counted_tag(self, *args):
        calls["tag"] += 1
        return tag_append(self, *args)

    monkeypatch.setattr(recorder.RunWriter, "append_scalar_batch", counted_batch)
    monkeypatch.setattr(recorder.RunWriter, "append_scalars", counted_tag)
    broker = Broker(tmp_path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            for k in range(1, 4):
                await broker.wait_written(await broker.ingest(Batch("w", k, "run", _columns(k))))
            # A batch with a large column goes tag by tag (joining would only copy it).
            big = np.arange(10, 10 + broker_module.GROUP_BELOW, dtype=np.int64)
            large = [
                ScalarColumns("m0", big, 1.8e9 + big.astype(float), big * 0.5),
                ScalarColumns("m1", big[:1], np.array([1.8e9]), np.array([2.0])),
            ]
            await broker.wait_written(await broker.ingest(Batch("w", 4, "run", large)))
            broker.close()
            await broker.wait_closed()
    assert calls == {"batch": 3, "tag": 2}
    reader = recorder.RunReader(tmp_path / "run")
    try:
        m3 = reader.read_scalars("m3")
        assert m3.steps.tolist() == [1, 2, 3] and m3.steps.dtype == np.int64
        assert reader.read_scalars("m5").values.tolist() == [1.625, 2.625, 3.625]
        m0 = reader.read_scalars("m0")
        assert m0.steps.tolist() == [1, 2, 3, *big.tolist()]
        assert reader.read_scalars("m1").values.tolist() == [1.125, 2.125, 3.125, 2.0]
        assert "empty" not in reader.tags()
    finally:
        reader.close()
