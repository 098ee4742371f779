"""The bus: several ``vdl-stream serve`` brokers as one dashboard, through Redis Streams.

``vdl-stream serve --bus redis://host:6379/0`` joins a broker to the others on the same Redis
(coredis, whose anyio backend runs on trio). Redis carries *live* data and leases only; the runs'
files (a log directory the brokers share on one host, or the object store across hosts) are the
truth. Keys, under a prefix (``vdl`` by default)::

    vdl:lease:<run>    string   id of the broker that writes the run; SET NX PX, renewed
    vdl:bus:<broker>   stream   live batches a broker accepted: one entry per publish round,
                                XADD MAXLEN ~ N; fields: b = broker id, r = msgpack array of
                                one record per run (several when a run's numbers have a hole):
                                [run, m, n, p, f]: batches m to n of the run (n = a per
                                (broker, run) counter), f their batch frame, p the counter of
                                the last batch of the run its broker had written when it sent
                                the round; n = 0: a retraction (a batch published before was
                                refused, receivers re-sync the run); n = -1: a settlement (the
                                run went quiet with everything written: p alone); expires
                                STREAM_EXPIRY after the broker's last round
    vdl:runs           stream   one entry each time a broker takes a run's lease: run, b (a
                                reader learns the broker's stream from it)

One stream per publishing broker, not per run: Redis 7.0 answers a blocked multi-stream ``XREAD``
with only the stream that woke it, so with a stream per run every run after the first of a
publish round waited for the receiver's next ``XREAD`` cycle; a round is one entry now, carried
whole by one wake-up, and a receiver's ``XREAD`` names the few brokers, not every run (and never
its own stream). The per-run semantics are kept in the records: each run's batches are numbered
per (broker, run), so a receiver that falls more than N rounds behind (trimmed) still sees a
hole in a run's numbers and re-syncs that run alone.

Data path of a batch, broker A (holding the run's lease) to a browser on broker B::

    A: ingest -> fan-out to A's subscribers, publish() -> bounded queue -> XADD vdl:bus:<A> MAXLEN ~ N
       (and persist (recorder) -> settled(): the next rounds' p)
    B: XREAD BLOCK (the registry and every other broker's stream) -> Broker._bus_fan_out -> B's subscribers

- **Published as it is accepted, not once written.** A batch goes to the bus when it is fanned
  out to the broker's own subscribers (at ingest), so the persist task (its queue, its worker
  thread, its once-a-second fsync) is not on the way to other brokers' browsers: on a busy 2-core
  host that was a third of the cross-broker latency, and the fsync pauses its tail (docs/
  performance.md, "Cross-broker latency"). What a receiver fanned out may thus be missing from
  the files for a moment, so entries say how far their broker has written (``p``): a receiver
  keeps the frames of entries past that (:meth:`Bus.unsettled`, at most ``UNSETTLED_KEPT`` a
  run, ``UNSETTLED_SECONDS`` old) and sends them again after a snapshot of the run read from the
  files (twice rather than not at all). A run that goes quiet has no next entry to carry the
  ``p`` of its last batch: once everything published of it is written and nothing came for
  :data:`SETTLE_DELAY`, its broker adds a settlement entry (``b`` and ``p`` alone; at most one
  per quiet spell, so a run that keeps sending never adds one). Frames pushed out unsettled
  (past ``UNSETTLED_KEPT`` or ``UNSETTLED_SECONDS``: their broker is far behind, or dead) can no
  longer be sent again after a snapshot: the receiver drops every unsettled frame of the run and
  its subscribers re-sync it (a ``gap``), so that they show what the files hold. A batch
  refused after it was published (its lease lost, a disk error) is followed by a retraction
  entry, and a run whose entries come from a new broker while the previous one's were
  unsettled (it died before writing them) is re-synced: in both cases the receivers'
  subscribers get a ``gap`` naming the run and re-read it from the files, the way a broker's
  own subscribers re-sync a batch refused after its fan-out.

- **Coalesced while busy, at once when idle.** The publisher takes a batch as soon as one is
  queued; if its previous round began less than :data:`PUBLISH_TICK` ago it first waits for the
  rest of that tick, then puts every queued batch of a run into one record of the round's
  entry (their columns concatenated per tag), so a busy broker sends at most one entry a tick,
  however many runs, writers and batches, and an idle one adds no delay. A round goes without
  waiting for the previous round's answer (an ack task reads the answers). The reader turns what
  one ``XREAD`` returns of a run into one ``data`` frame, however many rounds.

- **Ingest never waits on Redis for data.** ``publish`` is ``send_nowait`` into a bounded queue;
  a full queue or a failed XADD drops the entry. Receivers see the hole in ``n`` and send their
  subscribers a ``gap`` naming that run (they re-sync it alone from a snapshot, read from the
  files; docs/protocol.md).
- **Exactly one broker persists a run.** A broker takes a run's lease at its first batch (Lua:
  ``SET NX PX``, or extend it if it is already this broker's), renews every lease it holds every
  ``lease_ttl / 3`` (a failed renewal again after ``RENEW_RETRY``) with a Lua
  check-and-extend (a broker never renews a lease it lost), and
  releases it with a Lua check-and-delete when the run goes idle or the broker closes. Locally a
  lease counts as held until ``lease_ttl * 2 / 3`` after the command that last confirmed it was
  *sent*, so a broker stops writing before Redis could give the run to another. A batch of a run
  leased elsewhere is refused (retryable); writers given several URLs move to the next broker.
- **Failover.** The broker that takes a run over reads the writers' sequence numbers back from the
  run's files (``Broker._bus_took``); the writer re-sends what was not acknowledged and the
  broker's dedup by (writer, seq) drops what is already there: 0 lost, 0 duplicated. A broker
  whose own hold ran out before its lease loop noticed, and that takes the lease again from
  Redis (free meanwhile: another broker may have written the run), first gives the run up and
  then takes it over like any other broker; kept, its stale sequence numbers refused the
  writer for good while it renewed the lease, and every other broker refused it too.
- **Redis restart.** Live frames in flight are lost, never data: every broker sends its
  subscribers a ``gap`` when its reader loses Redis and when it gets it back, and meanwhile
  serves runs of the shared log directory by tailing their files (as without a bus).
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

import msgpack
import trio

from . import bus_resp, bus_trace, codec
from .codec import Batch, ScalarColumns
from .errors import RefusedError

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger("vdl_stream.bus")

#: Default lease time to live in seconds: how long a killed broker's runs wait for another broker.
LEASE_TTL = 3.0
#: Default bound of each broker's stream (``XADD MAXLEN ~``), in publish rounds: a receiver this
#: far behind finds holes in the runs' numbers and re-syncs them (a gap).
STREAM_MAXLEN = 10_000
#: Seconds after its last round a broker's stream expires (a stopped broker's goes by itself;
#: the broker's last rounds are long in the runs' files by then).
STREAM_EXPIRY = 3600.0
#: Bound of the run registry stream.
REGISTRY_MAXLEN = 100_000
#: Default capacity of the publish queue, in batches; past it entries are dropped (and counted).
PUBLISH_QUEUE = 4096
#: Seconds without a batch after which a broker releases a run's lease (and closes its writer).
IDLE_RELEASE = 30.0
#: Bound on one Redis command of the ingest and lease paths, in seconds.
COMMAND_TIMEOUT = 1.0
#: Seconds before a failed lease renewal is tried again.
RENEW_RETRY = 0.1
#: Entries one XREAD returns at most, and the ms it blocks.
READ_COUNT = 1000
READ_BLOCK_MS = 1000
#: Writers whose refused batch has not come again, remembered at most (oldest forgotten).
PENDING_KEPT = 65_536
#: Batches one publish round takes from the queue at most (merged into one entry per run).
PUBLISH_ROUND = 1024
#: Seconds between the starts of two publish rounds while batches keep coming: a busy broker
#: merges what a run's writers send in a tick into one stream entry (and the other brokers into
#: one frame); a batch arriving after a quiet tick goes at once. 2 ms, not 5: at 400 batches/s a
#: broker (30,000 events/s on 3 brokers) every batch came within a tick of the previous round and
#: waited about half a tick, while few were merged (a run sends one batch every 40 ms).
PUBLISH_TICK = 0.002
#: Publish rounds sent and not yet answered, at most: past it the publish loop waits (and the
#: batches queued meanwhile go in one larger round).
IN_FLIGHT = 64
#: Frames of a run fanned out from another broker and not yet reported written by it, kept at
#: most (per run, and seconds), to be sent again after a snapshot of that run.
UNSETTLED_KEPT = 256
UNSETTLED_SECONDS = 5.0
#: Seconds a run stays quiet (everything published of it written, no new batch) before its broker
#: adds a settlement entry, so that receivers stop keeping its last frames: a run that sends more
#: often never adds one, and a run adds at most one per quiet spell.
SETTLE_DELAY = 0.25
#: Seconds a broker giving runs up (closing, or idle) waits for the object store to take their
#: heads before it releases their leases anyway.
PUBLISH_DEADLINE = 30.0

# KEYS[1] the lease; ARGV: broker id, ttl ms. 1: taken, 2: already ours (extended), 0: elsewhere.
_ACQUIRE = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return 2 end
return 0
"""
# KEYS: leases; ARGV: broker id, ttl ms. Per key 1 if still ours (extended), 2 if it was missing
# (Redis restarted without its data) and is taken again (no other broker took it meanwhile), else 0.
_EXTEND = """
local held = {}
for i, key in ipairs(KEYS) do
  local holder = redis.call('get', key)
  if holder == ARGV[1] then
    redis.call('pexpire', key, ARGV[2]) held[i] = 1
  elseif not holder then
    redis.call('set', key, ARGV[1], 'PX', ARGV[2]) held[i] = 2
  else held[i] = 0 end
end
return held
"""
# KEYS[1] the lease; ARGV[1] broker id: delete only if still ours.
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class BusStatistics:
    """A point-in-time view of a broker's bus.

    Attributes:
        broker: this broker's id on the bus.
        connected: whether the reader reaches Redis now (live frames of other brokers flow).
        leases: runs this broker holds the lease of.
        published: batches added to this broker's stream.
        dropped: batches not published (queue full, or Redis slow or down).
        queue_depth: batches waiting to be published; queue_peak: the most that waited.
        received: batches of other brokers fanned out here.
        gaps: holes found in other brokers' entries (their subscribers were sent a gap).
        refused_leased: batches refused because another broker holds their run.
        leases_lost: leases found taken or expired while this broker thought it held them.
        reads: XREADs that returned entries of other brokers or announcements (each round
            of another broker costs one when this broker's reader waits for it).
        entries: stream entries added (one per publish round; each holds one or more of the
            ``published`` batches of one or more runs).
        stages: with ``VDL_STREAM_BUS_TRACE=1`` only, the ages of points at each stage of the
            bus path and the event loop's stalls (vdl_stream/bus_trace.py; summarized once a
            second in a worker thread, None before the first); else None.
    """

    broker: str
    connected: bool
    leases: int
    published: int
    dropped: int
    queue_depth: int
    queue_peak: int
    received: int
    gaps: int
    refused_leased: int
    leases_lost: int
    entries: int = 0
    reads: int = 0
    stages: dict[str, Any] | None = None


def _expired(held: collections.deque[tuple[int, float, Any, Any]], now: float) -> bool:
    """Whether the oldest unsettled frame is older than :data:`UNSETTLED_SECONDS`."""
    return bool(held) and held[0][1] < now - UNSETTLED_SECONDS


def check_bus_url(url: str) -> str:
    """Return ``url`` if it is a Redis URL the bus can use.

    Raises:
        ValueError: it is not ``redis://`` or ``rediss://`` with a host (the message names it).
    """
    if not isinstance(url, str):
        raise ValueError(f"--bus must be a redis:// URL, got {url!r:.80}")
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ValueError(f"--bus must be a redis://host:port/db URL, got {url!r:.80}")
    return url


class Bus:
    """Joins one broker to the others on a Redis: leases, and live data both ways.

    Create it, then run :meth:`run` in the broker's nursery (``await nursery.start(bus.run)``);
    it returns once the broker is closed and its leases are released.

    Args:
        broker: the broker to join; its hooks (``Broker._bus_*``) call back into it.
        url: ``redis://host:port/db`` (``rediss://`` for TLS).
        prefix: the keys' prefix, so that several dashboards can share one Redis.
        lease_ttl: lease time to live in seconds (renewed every third of it).
        maxlen: approximate bound of this broker's stream, in publish rounds.
        queue: capacity of the publish queue, in batches.
        idle_release: release a run's lease after this many seconds without a batch.

    Raises:
        ValueError: a bad ``url`` or a non-positive number, named in the message.
    """

    #: Refusal reason of a batch whose run another broker holds.
    LEASED_ELSEWHERE = "the run is being written through another broker (it holds the run's lease)"
    #: Refusal reason of a batch queued before this broker lost the run's lease.
    LEASE_LOST = "the run moved to another broker (this broker's lease on it ended)"
    #: Refusal reason when Redis cannot be reached to take a run's lease.
    UNREACHABLE = "the dashboard's bus (Redis) cannot be reached to take the run's lease"

    def __init__(
        self,
        broker: Broker,
        url: str,
        *,
        prefix: str = "vdl",
        lease_ttl: float = LEASE_TTL,
        maxlen: int = STREAM_MAXLEN,
        queue: int = PUBLISH_QUEUE,
        idle_release: float = IDLE_RELEASE,
    ) -> None:
        self.url = check_bus_url(url)
        for name, value in (
            ("lease_ttl", lease_ttl),
            ("maxlen", maxlen),
            ("queue", queue),
            ("idle_release", idle_release),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix must be a non-empty str, got {prefix!r}")
        self.broker = broker
        self.id = uuid.uuid4().hex[:16]
        self._prefix = prefix
        self._ttl = float(lease_ttl)
        self._maxlen = int(maxlen)
        self._idle_release = float(idle_release)
        self._registry = f"{prefix}:runs"
        self._send, self._receive = trio.open_memory_channel[tuple[str, int, bytes | Batch]](
            int(queue)
        )
        self._redis: Any = None
        # The publish loop's connection (vdl_stream/bus_resp.py; opened again after a failure).
        self._publisher: bus_resp.Connection | None = None
        # run -> monotonic time until which this broker may write it (read by the persist thread)
        self._held: dict[str, float] = {}
        self._used: dict[str, float] = {}  # run -> monotonic time of its last batch
        self._locks: dict[str, trio.Lock] = {}  # run -> serialises taking and giving its lease
        self._counters: dict[str, int] = {}  # run -> the n of this broker's last entry
        # (run, writer) -> (seq, refusal, last): batches ``seq`` to ``last`` (the highest since)
        # were refused before they reached their run
        self._pending: dict[tuple[str, str], tuple[int, RefusedError, int]] = {}
        self._seen: dict[tuple[bytes, str], int] = {}  # (broker, run) -> n of its last entry
        # Publishing side: run -> numbers of its published batches not yet reported by the
        # persist task (oldest first), and the number of the last one reported.
        self._unwritten: dict[str, collections.deque[int]] = {}
        self._written: dict[str, int] = {}
        # run -> trio time at which everything published of it was written (and nothing was
        # published since): a settlement entry is due SETTLE_DELAY later. In insertion order,
        # which is that time's order (publish() removes a run, settled() adds it at the end).
        self._quiet: dict[str, float] = {}
        self._waiting: trio.CancelScope | None = None  # the publish loop's wait for a batch
        # Receiving side: run -> (broker, frames (n, monotonic time, scalars, events) of its
        # entries not yet reported written), bounded by UNSETTLED_KEPT and UNSETTLED_SECONDS.
        self._unsettled: dict[
            str, tuple[bytes, collections.deque[tuple[int, float, Any, Any]]]
        ] = {}
        self._connected = False
        self._published = self._dropped = self._received = self._gaps = 0
        self._refused_leased = self._leases_lost = self._queue_peak = 0
        self._entries = self._reads = 0
        self._xread_at = 0.0
        broker._bus = self

    # -- keys -----------------------------------------------------------------------------------

    def _lease_key(self, run: str) -> str:
        return f"{self._prefix}:lease:{run}"

    def _bus_key(self, broker: str) -> str:
        return f"{self._prefix}:bus:{broker}"

    # -- hooks the broker calls -----------------------------------------------------------------

    def holds(self, run: str) -> bool:
        """Return whether this broker may write ``run`` now (thread-safe: the persist thread asks)."""
        until = self._held.get(run)
        return until is not None and time.monotonic() < until

    def carries(self, run: str) -> bool:
        """Return whether live frames of ``run`` from other brokers reach this broker now."""
        return self._connected

    async def admit(self, batch: Batch) -> None:
        """Make sure this broker holds the lease of the batch's run before it takes the batch.

        A held lease costs a dictionary look-up; otherwise one Redis round trip (bounded by
        ``COMMAND_TIMEOUT``) takes it.

        Raises:
            RefusedError: (retryable) another broker holds the run, or Redis cannot be reached.
        """
        if bus_trace.ON and (w := bus_trace.walls_of(batch.scalars)) is not None:
            bus_trace.age("1_admitted", w)
        await self._admit(batch.run)

    def check_order(self, batch: Batch, last_seq: dict[str, int]) -> None:
        """Refuse ``batch`` if an earlier batch of its writer was refused before it reached the
        run (:meth:`refused`) and has not come again: the lease may be free by the time the later
        ones arrive, and taking them first would make the refused one look like a duplicate of
        data already written, and be dropped. ``last_seq`` is what the run's files hold of each
        writer: refused batches that another broker wrote meanwhile, every one up to the highest
        refused here, are settled.

        Raises:
            RefusedError: (retryable) that earlier batch has to come first.
        """
        key = (batch.run, batch.writer)
        pending = self._pending.get(key)
        if pending is None:
            return
        first, refusal, last = pending
        done = last_seq.get(batch.writer, 0)
        if batch.seq <= first or min(last, batch.seq - 1) <= done:
            # It (or an earlier one) is back, or every refused batch before it is in the run
            # (written elsewhere meanwhile, or taken here again): the writer goes on in order.
            # Forgotten only once all of them are: until then a later batch still arriving on
            # the writer's previous connection must not land over the ones not yet re-sent.
            if last <= max(done, batch.seq):
                del self._pending[key]
            return
        raise refusal

    def refused(self, batch: Batch, refusal: RefusedError) -> None:
        """Note that ``batch`` was refused before it reached its run (see :meth:`admit`)."""
        if not refusal.retryable:
            return  # the writer forgets that batch and goes on with the next
        key = (batch.run, batch.writer)
        pending = self._pending.get(key)
        if pending is None:
            self._pending[key] = (batch.seq, refusal, batch.seq)
            while len(self._pending) > PENDING_KEPT:  # writers that never came back
                del self._pending[next(iter(self._pending))]
        elif batch.seq < pending[0]:
            self._pending[key] = (batch.seq, refusal, max(pending[2], batch.seq))
        elif batch.seq > pending[2]:
            self._pending[key] = (pending[0], pending[1], batch.seq)

    async def _admit(self, run: str) -> None:
        now = time.monotonic()
        self._used[run] = now
        if self.holds(run):
            return
        async with self._lock(run):
            if self.holds(run):
                return
            sent = time.monotonic()
            try:
                with trio.fail_after(COMMAND_TIMEOUT):
                    got = await self._redis.eval(
                        _ACQUIRE, [self._lease_key(run)], [self.id, int(self._ttl * 1000)]
                    )
            except Exception as exc:
                if not _redis_failure(exc):
                    raise
                raise RefusedError(self.UNREACHABLE, retryable=True) from None
            if int(got) == 0:
                self._refused_leased += 1
                raise RefusedError(self.LEASED_ELSEWHERE, retryable=True)
            if int(got) == 1 and run in self._held:
                # This broker's hold ran out before the lease loop noticed, and the lease was
                # free in Redis: another broker may have written the run meanwhile. Give it up
                # first (close its writer), as a lost lease, so that the take-over below reads
                # the writers' seqs back from the files; kept, the stale ones refused the
                # writer's next batches for good (the writer then stalled, every broker
                # refusing it: "written through another broker").
                del self._held[run]
                self._leases_lost += 1
                await self.broker._bus_release(run)
            if run not in self._held:
                kept = self._unsettled.pop(run, None)
                if kept is not None and any(f[1] >= sent - UNSETTLED_SECONDS for f in kept[1]):
                    # Frames of the previous writing broker that it may never have written
                    # (it died): this broker's subscribers re-sync the run from its files.
                    self.broker._bus_gap(run)
                self.broker._bus_took(run)  # read the writers' seqs back from the run's files
                self._register(run)
            self._held[run] = sent + self._ttl * 2 / 3

    def publish(self, batch: Batch) -> None:
        """Queue an accepted batch for the other brokers, as it is fanned out to this broker's
        subscribers (at ingest, not once written: see :meth:`settled`); never blocks (drops when
        full)."""
        if bus_trace.ON and (w := bus_trace.walls_of(batch.scalars)) is not None:
            bus_trace.age("2_published", w)
        n = self._counters.get(batch.run, 0) + 1
        self._counters[batch.run] = n  # a dropped entry still takes its number: receivers see it
        self._quiet.pop(batch.run, None)  # its entry carries p: no settlement
        self._unwritten.setdefault(batch.run, collections.deque()).append(n)
        try:
            self._send.send_nowait((batch.run, n, batch))
        except trio.WouldBlock:
            self._dropped += 1
            return
        self._queue_peak = max(self._queue_peak, self._send.statistics().current_buffer_used)

    def settled(self, run: str, *, refused: bool = False) -> None:
        """The persist task is done with the oldest published batch of ``run`` it had not yet
        reported: it is in the files, or (``refused``) it never will be. Entries carry the number
        of the last batch reported (``p``), so that a receiver knows which of the frames it
        fanned out may still be missing from the files (:meth:`unsettled`); a refused one is
        followed by a retraction entry, and the receivers' subscribers re-sync the run. Once
        every published batch of the run is reported and none follows for :data:`SETTLE_DELAY`,
        a settlement entry carries ``p`` alone."""
        pending = self._unwritten.get(run)
        if not pending:
            return
        self._written[run] = pending.popleft()
        if not pending:
            del self._unwritten[run]
            if not refused:  # a retraction carries p itself
                now = self._quiet[run] = trio.current_time()
                if self._waiting is not None:  # the publish loop waits for a batch: and this
                    self._waiting.deadline = min(self._waiting.deadline, now + SETTLE_DELAY)
        if refused:
            try:
                self._send.send_nowait((run, -1, b""))
            except trio.WouldBlock:
                # Lost too: a hole in the numbers instead, which the receivers treat alike.
                self._counters[run] = self._counters.get(run, 0) + 1
                self._dropped += 1

    def unsettled(self, run: str) -> list[tuple[list[ScalarColumns], list[dict[str, Any]]]]:
        """The columns and events of ``run`` fanned out here from another broker that it had not
        reported written when it last said (at most :data:`UNSETTLED_SECONDS` old): a snapshot
        read from the files now may lack them."""
        held = self._unsettled.get(run)
        if held is None:
            return []
        _, frames = held
        horizon = time.monotonic() - UNSETTLED_SECONDS
        return [(scalars, events) for _, at, scalars, events in frames if at >= horizon]

    def _register(self, run: str) -> None:
        """Announce run ``run`` in the registry stream (through the publish queue, never waits)."""
        try:
            self._send.send_nowait((run, 0, b""))
        except trio.WouldBlock:
            self._dropped += 1

    def _lock(self, run: str) -> trio.Lock:
        lock = self._locks.get(run)
        if lock is None:
            lock = self._locks[run] = trio.Lock()
        return lock

    def statistics(self) -> BusStatistics:
        """Return counters and queue depths (see :class:`BusStatistics`)."""
        return BusStatistics(
            broker=self.id,
            connected=self._connected,
            leases=sum(1 for r in list(self._held) if self.holds(r)),
            published=self._published,
            dropped=self._dropped,
            queue_depth=self._send.statistics().current_buffer_used,
            queue_peak=self._queue_peak,
            received=self._received,
            gaps=self._gaps,
            refused_leased=self._refused_leased,
            leases_lost=self._leases_lost,
            entries=self._entries,
            reads=self._reads,
            stages=bus_trace.latest() if bus_trace.ON else None,
        )

    # -- tasks ----------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Publish, read and keep leases until the broker is closed; then release the leases.

        Starts even when Redis cannot be reached (runs are refused, retryably, until it can:
        no lease can be taken), and keeps trying to reach it.
        """
        import coredis  # the bus extra: the default single-machine path never imports it

        # Leases through coredis; the hot commands (the publish loop's XADDs, the read loop's
        # XREADs) on connections of their own (vdl_stream/bus_resp.py), each used by its loop's
        # task alone: no hand-off to a writer task and back from a reader task per command, and
        # a lease's renewal never waits behind a round of large entries (a busy broker could
        # lose every lease at once when two renewals timed out).
        self._redis = coredis.Redis.from_url(
            self.url, stream_timeout=COMMAND_TIMEOUT * 2, connect_timeout=COMMAND_TIMEOUT
        )
        async with self._redis, trio.open_nursery() as nursery:
            nursery.start_soon(self._publish_loop)
            nursery.start_soon(self._read_loop)
            nursery.start_soon(self._lease_loop)
            if bus_trace.ON:  # diagnostics (vdl_stream/bus_trace.py)
                nursery.start_soon(bus_trace.watch_loop)
            task_status.started()
            await self.broker.wait_closed()
            # Clean close: the broker fsynced and closed its runs; publish them to the object
            # store (if any: the next broker continues them from there), while the lease loop
            # still renews the leases, then let others take them at once.
            with trio.move_on_after(PUBLISH_DEADLINE, shield=True):
                await self.broker._bus_publish(list(self._held))
            with trio.move_on_after(2, shield=True):
                await self._release_all()
            nursery.cancel_scope.cancel()

    async def _publish_loop(self) -> None:
        """Move queued batches to this broker's stream: one entry per round, holding a record per
        run (:func:`_round_fields`), after the round's run announcements, in one write; rounds
        start at most once a :data:`PUBLISH_TICK`, without waiting for the previous round's
        answers (:meth:`_ack_loop` reads them); settlement records of quiet runs when due."""
        sent, answers = trio.open_memory_channel[_Sent](IN_FLIGHT)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._ack_loop, answers)
            await self._publish_rounds(sent)

    async def _publish_rounds(self, sent: trio.MemorySendChannel[_Sent]) -> None:
        """Send the rounds (see :meth:`_publish_loop`); each goes to ``sent`` for its answers."""
        last = -float("inf")
        stream = self._bus_key(self.id)
        expiry_due = -float("inf")  # when the stream's expiry is to be pushed back again
        while True:
            items: list[tuple[str, int, bytes | Batch]] = []
            # Wake for the first batch, or when the oldest quiet run's settlement is due (the
            # quiet runs are in the order they went quiet).
            with trio.move_on_at(
                next(iter(self._quiet.values()), float("inf")) + SETTLE_DELAY
            ) as self._waiting:
                items.append(await self._receive.receive())
            self._waiting = None
            if items:
                wait = last + PUBLISH_TICK - trio.current_time()
                if wait > 0:  # busy: let this tick's batches gather (idle: nothing waits)
                    await trio.sleep(wait)
                last = trio.current_time()
            while len(items) < PUBLISH_ROUND:
                try:
                    items.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            registry, entries = _coalesce(items)
            entries += self._settlements(trio.current_time())
            if not registry and not entries:
                continue
            written = {run: self._written.get(run, 0) for run, _, _, _ in entries}
            walls = (  # diagnostics only: no pass over the items otherwise
                [
                    w
                    for _, n, b in items
                    if n > 0 and (w := bus_trace.walls_of(b.scalars)) is not None
                ]
                if bus_trace.ON
                else []
            )
            for w in walls:
                bus_trace.age("3_xadd_sent", w)
            batches = sum(n - m + 1 for _, m, n, _ in entries if n > 0)
            # Announcements first: a reader learns a broker's stream from its first announcement,
            # and a run's from its own. All in one write, the answers read in one go.
            commands: list[tuple[bytes | str | int, ...]] = [
                (
                    "XADD",
                    self._registry,
                    "MAXLEN",
                    "~",
                    REGISTRY_MAXLEN,
                    "*",
                    "run",
                    run,
                    "b",
                    self.id,
                )
                for run in registry
            ]
            if entries:
                fields = _round_fields(self.id, entries, written)
                commands.append(("XADD", stream, "MAXLEN", "~", self._maxlen, "*", *_flat(fields)))
                if trio.current_time() >= expiry_due:
                    # A stopped or killed broker's stream goes by itself, STREAM_EXPIRY after its
                    # last round (pushed back once a minute at most while it publishes).
                    commands.append(("PEXPIRE", stream, int(STREAM_EXPIRY * 1000)))
                    expiry_due = trio.current_time() + STREAM_EXPIRY / 60
            try:
                with trio.fail_after(COMMAND_TIMEOUT * 2):
                    if self._publisher is None or self._publisher.closed:
                        self._publisher = await bus_resp.open_connection(self.url)
                    await self._publisher.send(commands)
            except Exception as exc:
                if not _redis_failure(exc):
                    raise
                if self._publisher is not None:
                    await self._publisher.aclose()
                    self._publisher = None
                self._dropped += batches
                log.debug("publishing to the bus failed: %s", exc)
                continue
            self._entries += bool(entries)
            # Its answers are the ack loop's: the next round goes without waiting for them. At
            # most IN_FLIGHT rounds unanswered (each is answered, or its connection closed,
            # within COMMAND_TIMEOUT * 2 of its send).
            await sent.send((self._publisher, len(commands), batches, walls, trio.current_time()))

    async def _ack_loop(self, sent: trio.MemoryReceiveChannel[_Sent]) -> None:
        """Read the answers of the rounds the publish loop sent, in order: count their batches
        published, or dropped (an error answer, or none within ``COMMAND_TIMEOUT * 2`` of the
        send: the connection is closed, and the publish loop opens another)."""
        async for connection, count, batches, walls, at in sent:
            try:
                with trio.fail_at(at + COMMAND_TIMEOUT * 2):
                    for reply in await connection.receive(count):
                        if isinstance(reply, bus_resp.ReplyError):
                            raise reply
            except Exception as exc:
                if not _redis_failure(exc):
                    raise
                await connection.aclose()
                self._dropped += batches
                log.debug("publishing to the bus failed: %s", exc)
                continue
            self._published += batches
            for w in walls:
                bus_trace.age("4_xadd_acked", w)

    def _settlements(self, now: float) -> list[tuple[str, int, int, bytes]]:
        """The settlement entries due at ``now`` (``(run, 0, -1, b"")``): runs quiet for
        :data:`SETTLE_DELAY` with every published batch written, and still held by this broker
        (a settlement of a run another broker writes now would read as a take-over)."""
        due = []
        for run, at in self._quiet.items():  # in the order they went quiet
            if at + SETTLE_DELAY > now:
                break
            due.append(run)
        for run in due:
            del self._quiet[run]
        return [(run, 0, -1, b"") for run in due if run in self._held]

    async def _read_loop(self) -> None:
        """Fan out the other brokers' entries to this broker's subscribers; on losing Redis,
        re-sync the subscribers (a gap) and start again from the present."""
        delay = 0.1
        while True:
            try:
                await self._read_from_now()
            except Exception as exc:
                if not _redis_failure(exc):
                    raise
                if self._connected:
                    log.warning("vdl-stream: lost the bus (%s); browsers re-sync", _describe(exc))
                    self._connected = False
                    self.broker._bus_gap(None)
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.1

    async def _read_from_now(self) -> None:
        """Read every other broker's stream from the present on (returns only by raising)."""
        with trio.fail_after(COMMAND_TIMEOUT):
            redis = await bus_resp.open_connection(self.url)
        try:
            await self._read(redis)
        finally:
            await redis.aclose()

    async def _read(self, redis: bus_resp.Connection) -> None:
        """The read loop over one connection: announcements, then every other broker's rounds."""
        with trio.fail_after(COMMAND_TIMEOUT):
            seconds, micros = await redis.call("TIME")
        start = f"{int(seconds) * 1000 + int(micros) // 1000}-0"
        # The registry, and each broker's stream once the registry names it. Runs and brokers
        # already registered are read from now: what they hold before is in the files.
        streams: dict[str, str] = {self._registry: start}
        followed: set[str] = set()  # runs announced (the reader fans out their records)
        with trio.fail_after(COMMAND_TIMEOUT * 5):
            announced = bus_resp.entries(
                await redis.call("XREVRANGE", self._registry, "+", "-", "COUNT", REGISTRY_MAXLEN)
            )
        for _, fields in announced:
            run = _text(fields.get(b"run"))
            if run and run not in followed:
                followed.add(run)
                self.broker._bus_learn(run)
            self._follow(streams, fields.get(b"b"), start)
        if not self._connected:
            self._connected = True
            self.broker._bus_gap(None)  # frames were lost while away: re-sync from snapshots
            for run in list(self._held):
                self._register(run)  # a restarted Redis knows none of this broker's runs
        self._seen.clear()
        registry = self._registry.encode()
        swept = time.monotonic()
        while True:
            with trio.fail_after(READ_BLOCK_MS / 1000 + 5):
                result = bus_resp.streams(
                    await redis.call(
                        "XREAD",
                        "COUNT",
                        READ_COUNT,
                        "BLOCK",
                        READ_BLOCK_MS,
                        "STREAMS",
                        *streams,
                        *streams.values(),
                    )
                )
            self._xread_at = time.time()
            self._reads += bool(result)
            for key, entries in result.items():
                if entries:
                    streams[key.decode()] = entries[-1][0].decode()
            # Announcements first: a run announced in the rounds' reply is followed before its
            # records are fanned out, and a new broker's stream is read from its announcement.
            for identifier, fields in result.get(registry, ()):
                run = _text(fields.get(b"run"))
                if run and run not in followed:
                    followed.add(run)
                    # A run known here already (from its files) may have records from before
                    # its announcement (a broker that announces its runs again after a Redis
                    # restart): its subscribers re-sync.
                    if self.broker._bus_learn(run):
                        self.broker._bus_gap(run)
                ms = _entry_id(identifier)[0]
                # Its broker's next round may get an id of the same millisecond below this
                # entry's: read that stream from the millisecond before.
                self._follow(streams, fields.get(b"b"), f"{ms - 1}-{2**64 - 1}")
            runs: dict[str, list[Record]] = {}
            for at, source, fields in sorted(  # the rounds of every broker in Redis's order
                (_entry_id(identifier), key, fields)
                for key, entries in result.items()
                if key != registry
                for identifier, fields in entries
            ):
                try:
                    for run, record in _records(fields, at[0] / 1000):
                        runs.setdefault(run, []).append(record)
                except (KeyError, TypeError, ValueError):
                    log.warning("vdl-stream: ignoring a malformed bus entry of %r", source)
            for run, records in runs.items():
                self._fan_out(run, records)
            if time.monotonic() - swept >= 1.0:  # runs that went quiet keep nothing for long
                swept = time.monotonic()
                self._sweep(swept)
            # No checkpoint here: the next XREAD's send and receive yield anyway, and on a
            # busy host each extra pass of the scheduler before it is sent is time the next
            # entries wait in Redis.

    def _follow(self, streams: dict[str, str], broker: Any, start: str) -> None:
        """Read ``broker``'s stream from ``start`` on, unless it is read already or this one's."""
        source = _text(broker)
        if source and source != self.id:
            streams.setdefault(self._bus_key(source), start)

    def _fan_out(self, run: str, records: Iterable[Record]) -> None:
        """Fan out the records of ``run`` one XREAD returned as one ``data`` frame: the more
        a broker falls behind, the more each frame carries (columns of a tag concatenated), so
        browsers get fewer, larger frames instead of overflowing their queues.

        Keeps the frames that the writing broker has not reported written yet
        (:meth:`unsettled`). The subscribers re-sync the run (a ``gap``) after a hole in the
        records' numbers, after a retraction (a batch refused after it was published), and when
        another broker starts writing the run while frames of the previous one were unsettled
        (it may have died before writing them)."""
        batches: list[tuple[list[ScalarColumns], list[dict[str, Any]]]] = []
        gap = False
        now = time.monotonic()
        own = self.id.encode()
        for record in records:
            source, m, n, written = record.source, record.m, record.n, record.written
            if source == own:
                continue  # this broker's own: its subscribers had it at ingest
            try:
                # a broker's own frame of batches it checked at ingest: its shape only
                batch = (
                    codec.decode_checked_batch(codec.decode_message(record.frame))
                    if n > 0
                    else None
                )
            except (ValueError, codec.ProtocolError, codec.BatchError):
                log.warning("vdl-stream: ignoring a malformed bus entry of run %r", run)
                continue
            held, resync = self._hold(run, source, now)
            gap = gap or resync
            while held and held[0][0] <= written:
                held.popleft()
            if n < 0:
                continue  # a settlement
            if batch is None:
                gap = True  # a retraction: a batch fanned out before was refused
                continue
            last = self._seen.get((source, run))
            self._seen[(source, run)] = n
            if last is not None and m != last + 1:
                self._gaps += 1
                gap = True
            self._received += n - m + 1
            batches.append((batch.scalars, batch.events))
            if n > written:
                if len(held) >= UNSETTLED_KEPT:
                    # One more would push the oldest out unsettled: it could no longer be sent
                    # after a snapshot. Forget them all and re-sync the run from the files
                    # (at most once every UNSETTLED_KEPT frames).
                    held.clear()
                    gap = True
                held.append((n, now, batch.scalars, batch.events))
            if bus_trace.ON and (w := bus_trace.walls_of(batch.scalars)) is not None:
                bus_trace.age("6_xread", w, self._xread_at)
                bus_trace.age("5_in_redis", w, record.at)
        scalars, events = codec.join_batches(batches)
        if scalars or events:
            self.broker._bus_fan_out(run, scalars, events)
            if bus_trace.ON and (w := bus_trace.walls_of(scalars)) is not None:
                bus_trace.age("7_fanned_out", w)
        if gap:
            self.broker._bus_gap(run)

    def _sweep(self, now: float) -> None:
        """Forget the unsettled frames of every run whose oldest is older than
        :data:`UNSETTLED_SECONDS`, and re-sync those runs' subscribers (see :meth:`_hold`)."""
        for run, (_, held) in list(self._unsettled.items()):
            if _expired(held, now):
                del self._unsettled[run]
                self.broker._bus_gap(run)
            elif not held:
                del self._unsettled[run]

    def _hold(
        self, run: str, source: bytes, now: float
    ) -> tuple[collections.deque[tuple[int, float, Any, Any]], bool]:
        """The unsettled frames of ``run`` kept for ``source``, its writing broker, and whether
        the run's subscribers must re-sync (a fresh, empty list is started then): the oldest
        frame is older than :data:`UNSETTLED_SECONDS` (pushed out unsettled: its broker is far
        behind or dead, and a snapshot could lack every frame kept, which could no longer be
        sent after it), or another broker wrote the run before and frames of it are still
        unsettled (it may have died before writing them)."""
        kept = self._unsettled.get(run)
        resync = False
        if kept is not None:
            previous, held = kept
            resync = _expired(held, now) or (previous != source and bool(held))
            if previous == source and not resync:
                return held, False
        held = collections.deque()
        self._unsettled[run] = (source, held)
        return held, resync

    async def _lease_loop(self) -> None:
        """Renew held leases every third of the ttl; release idle ones; give up lost ones.

        A renewal that failed (Redis slow or away) is tried again after :data:`RENEW_RETRY`, not
        a third of the ttl later: on a starved host one renewal past its 1-s bound, then a
        third of the ttl of waiting, let every hold of the broker lapse at once.
        """
        renewed = True
        while True:
            await trio.sleep(self._ttl / 3 if renewed else min(RENEW_RETRY, self._ttl / 3))
            renewed = True
            for run in [r for r in list(self._held) if not self.holds(r)]:
                # Not confirmed in time (Redis away or slow): another broker may have it now.
                self._leases_lost += 1
                log.warning("vdl-stream: the lease of run %r ran out; another broker takes it", run)
                await self._give_up(run, release=False, until=self._held.get(run))
            now = time.monotonic()
            for run in [
                r for r in list(self._held) if now - self._used.get(r, 0) > self._idle_release
            ]:
                await self._give_up(run, release=True)
            runs = [r for r in list(self._held) if self.holds(r)]
            if not runs:
                continue
            sent = time.monotonic()
            try:
                with trio.fail_after(COMMAND_TIMEOUT):
                    kept = await self._redis.eval(
                        _EXTEND,
                        [self._lease_key(r) for r in runs],
                        [self.id, int(self._ttl * 1000)],
                    )
            except Exception as exc:
                if not _redis_failure(exc):
                    raise
                renewed = False
                continue  # unknown: the leases stay held until their local deadline
            for i, run in enumerate(runs):
                if int(kept[i]):
                    if run in self._held:
                        self._held[run] = sent + self._ttl * 2 / 3
                    if int(kept[i]) == 2:
                        self._register(run)  # Redis lost the registry too: announce it again
                else:
                    self._leases_lost += 1
                    log.warning("vdl-stream: lost the lease of run %r to another broker", run)
                    await self._give_up(run, release=False, until=self._held.get(run))

    async def _give_up(self, run: str, *, release: bool, until: float | None = None) -> None:
        """Stop writing ``run``: close its writer, then (``release``) delete the lease if ours.

        ``until``: the hold the caller found lost; if the run was taken again since (its hold
        changed while this waited for the run's lock), it is kept."""
        async with self._lock(run):
            if until is not None and self._held.get(run, until) != until:
                return  # taken again (a batch's admit) since the caller found it lost
            if self._held.pop(run, None) is None:
                return
            self._used.pop(run, None)
            await self.broker._bus_release(run)
            if release:
                # Idle: publish it first (object store), so the next broker continues from all;
                # within a third of the ttl, so that the lease loop renews the other leases.
                with trio.move_on_after(self._ttl / 3):
                    await self.broker._bus_publish([run])
                await self._delete_lease(run)  # unreachable: it expires within the ttl

    async def _release_all(self) -> None:
        """Delete every lease this broker holds (its runs are closed already)."""
        runs = list(self._held)
        self._held.clear()
        for run in runs:
            if not await self._delete_lease(run):
                return  # they expire by themselves within the ttl

    async def _delete_lease(self, run: str) -> bool:
        """Delete this broker's lease on ``run`` (only if it still holds it); False when Redis
        cannot be reached."""
        try:
            with trio.fail_after(COMMAND_TIMEOUT):
                await self._redis.eval(_RELEASE, [self._lease_key(run)], [self.id])
        except Exception as exc:
            if not _redis_failure(exc):
                raise
            return False
        return True


def _coalesce(
    items: list[tuple[str, int, bytes | Batch]],
) -> tuple[list[str], list[tuple[str, int, int, bytes]]]:
    """Split one publish round into the runs to announce and the run entries to add.

    Consecutive batches of a run (numbers ``m`` to ``n`` with no hole: a batch dropped from the
    queue still took its number, and its receivers must see that hole) become one entry
    ``(run, m, n, frame)``: one batch frame whose columns are the batches' columns of each tag
    concatenated in order, and whose events are theirs in order.
    """
    registry: list[str] = []
    spans: dict[str, list[tuple[int, int, list[Batch]]]] = {}  # run -> (m, n, batches) of each
    for run, n, batch in items:
        if n == 0:
            registry.append(run)
            continue
        runs = spans.setdefault(run, [])
        if n < 0:  # a retraction: its own entry, after the batches before it
            runs.append((0, 0, []))
            continue
        assert isinstance(batch, Batch)
        if runs and runs[-1][1] and runs[-1][1] + 1 == n:
            runs[-1] = (runs[-1][0], n, runs[-1][2])
            runs[-1][2].append(batch)
        else:
            runs.append((n, n, [batch]))
    entries = [
        (run, m, n, codec.encode_batch(_merge(batches, n)) if n else b"")
        for run, runs in spans.items()
        for m, n, batches in runs
    ]
    return registry, entries


class Record(NamedTuple):
    """One run's record in a publish round's entry, as a receiver reads it (:func:`_records`)."""

    #: The publishing broker's id.
    source: bytes
    #: The round holds batches ``m`` to ``n`` of the run (``n`` > 0), a retraction (``n`` 0: a
    #: batch published before was refused) or a settlement (``n`` -1: ``written`` alone).
    m: int
    n: int
    #: The number of the last batch of the run that its broker had written (``p``).
    written: int
    #: The batches' frame (``b""`` unless ``n`` > 0).
    frame: bytes
    #: Redis's clock when it added the round (its id), in seconds.
    at: float


def _round_fields(
    broker: str, entries: list[tuple[str, int, int, bytes]], written: dict[str, int]
) -> dict[str, Any]:
    """The fields of one publish round's entry of ``broker`` (see the module's layout):
    ``entries`` are ``(run, m, n, frame)``, batches ``m`` to ``n`` of a run, a retraction (``n``
    0) or a settlement (``n`` -1); ``written[run]``: the number of the last batch of the run that
    its persist task reported."""
    return {
        "b": broker,
        "r": msgpack.packb(
            [[run, m, n, written[run], frame] for run, m, n, frame in entries], use_bin_type=True
        ),
    }


def _records(fields: dict[bytes, bytes], at: float) -> list[tuple[str, Record]]:
    """The ``(run, record)`` pairs of a round's entry ``fields`` added at ``at`` (Redis's clock).

    Raises:
        KeyError, TypeError, ValueError: a malformed entry.
    """
    source = fields[b"b"]
    try:
        records = msgpack.unpackb(fields[b"r"], raw=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ValueError(f"malformed round: {type(exc).__name__}") from None
    out = []
    for run, m, n, written, frame in records:
        if type(run) is not str or not all(type(x) is int for x in (m, n, written)):
            raise ValueError("malformed record")
        if type(frame) is not bytes:
            raise TypeError("malformed record")
        out.append((run, Record(source, m, n, written, frame, at)))
    return out


def _entry_id(identifier: bytes) -> tuple[int, int]:
    """A stream entry id ``b"ms-seq"`` as numbers (ids of different streams compare by these)."""
    ms, _, seq = identifier.partition(b"-")
    return int(ms), int(seq or 0)


def _merge(batches: list[Batch], n: int) -> Batch:
    """One batch holding ``batches``' columns (concatenated per tag, in order) and events."""
    if len(batches) == 1:
        return batches[0]
    scalars, events = codec.join_batches((b.scalars, b.events) for b in batches)
    return Batch(
        writer=batches[0].writer, seq=n, run=batches[0].run, scalars=scalars, events=events
    )


#: A publish round sent, for the ack loop: the connection, its number of commands, the batches
#: it carries, their points' wall times (tracing only) and when it was sent (trio's clock).
_Sent = tuple[bus_resp.Connection, int, int, list[Any], float]


def _flat(fields: dict[str, Any]) -> list[Any]:
    """A stream entry's fields as XADD's arguments: name, value, name, value..."""
    return [x for pair in fields.items() for x in pair]


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _redis_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis being away, slow or refusing (as opposed to a bug)."""
    from coredis.exceptions import RedisError

    if isinstance(exc, BaseExceptionGroup):
        return all(_redis_failure(e) for e in exc.exceptions)
    return isinstance(
        exc, (RedisError, bus_resp.ReplyError, OSError, TimeoutError, trio.TooSlowError)
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    return str(exc) or type(exc).__name__
