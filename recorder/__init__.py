"""recorder: a standalone, crash-safe, fast record store for training runs.

A run is a directory of append-only segment files (framed, checksummed msgpack records; scalars
stored columnar) plus an index that can always be rebuilt from them. As a run written in small
flushes ages, its writer compacts sealed segments into block files (large columnar chunks with
summaries, events in batches, an index at the end), so that opening any run reads block indexes
and a bounded tail. The format is documented byte by byte in docs/record-format.md. Plain Python,
NumPy and msgpack; no knowledge of dashboards.
"""

from recorder.compaction import (
    CompactionProcess,
    CompactionProcessError,
    CompactionProcessLost,
    add_summaries,
)
from recorder.preview import write_preview
from recorder.reader import ReaderStatistics, RunReader, list_runs
from recorder.reader_pool import ReaderPool
from recorder.records import (
    CorruptionWarning,
    FormatError,
    NotARunError,
    Position,
    Record,
    RecorderError,
    RunLockedError,
    ScalarSeries,
    TagInfo,
)
from recorder.writer import LOCK_NAME, RunWriter, WriterStatistics, lock_holders, writers_gone

__all__ = [
    "LOCK_NAME",
    "CompactionProcess",
    "CompactionProcessError",
    "CompactionProcessLost",
    "CorruptionWarning",
    "FormatError",
    "NotARunError",
    "Position",
    "ReaderPool",
    "ReaderStatistics",
    "Record",
    "RecorderError",
    "RunLockedError",
    "RunReader",
    "RunWriter",
    "ScalarSeries",
    "TagInfo",
    "WriterStatistics",
    "add_summaries",
    "list_runs",
    "lock_holders",
    "write_preview",
    "writers_gone",
]
