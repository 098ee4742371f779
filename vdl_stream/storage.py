"""Log directories on object storage: ``s3://``, ``gs://`` and ``az://`` URLs.

A broker over ``--logdir s3://bucket/prefix`` keeps a local directory (the *cache*) as its log
directory: the runs it writes live there, crash-safe as always, and :class:`StoreSync` publishes
what their writers seal (compacted blocks, sealed segments, and the head every few seconds) to the
bucket with :class:`recorder.store.RunPublisher`; runs that other brokers wrote appear there as
mirrors (:class:`recorder.store.RunMirror`) that fetch bytes on demand. The object store is reached
through obstore (the Rust ``object_store`` crate), whose blocking calls run in
``trio.to_thread.run_sync`` under a limiter; its credentials and endpoint come from the usual
environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``GOOGLE_SERVICE_ACCOUNT``,
``AZURE_STORAGE_ACCOUNT_NAME``, ...). docs/object-storage.md describes the layout and the costs.

obstore is an optional dependency (``pip install 'vdl-stream[cloud]'``); local log directories
never import it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

import trio

import recorder
from recorder.store import (
    MANIFEST,
    Manifest,
    ManifestError,
    ObjectInfo,
    RangeCache,
    RunMirror,
    RunPublisher,
    StoreError,
    download_files,
    download_run,
    find_runs,
    manifest_key,
    read_manifest,
)

log = logging.getLogger("vdl_stream.storage")

SCHEMES = ("s3", "gs", "az")
_URL_RE = re.compile(r"^(s3|gs|az)://([^/?#]+)(/[^?#]*)?$")
# Requests to the store in flight at once, per broker.
STORE_THREADS = 8
# Seconds between two looks at the local runs for something to publish.
UPLOAD_INTERVAL = 1.0
# Seconds between two listings of the bucket for runs other brokers wrote.
LIST_INTERVAL = 5.0
# Seconds between two uploads of a live run's head segment (its newest records); the default of
# every StoreSync made after it is set (``serve --head-interval`` sets it for its process).
HEAD_INTERVAL = 10.0
# Bytes of fetched block data the mirrors keep, all runs together; the default of every StoreSync
# made after it is set (``serve --store-cache-mb``).
READ_CACHE_BYTES = 256 << 20
# A failing store is retried after this many seconds, doubling up to BACKOFF_MAX.
BACKOFF_MIN = 1.0
BACKOFF_MAX = 30.0
# obstore uploads a file object larger than this in parts of this size (its default).
MULTIPART_BYTES = 5 << 20
# Things warned about once (foreign objects, bad runs) remembered, at most.
WARNED_KEYS = 4096
# The last publish at shutdown gives up after this many seconds (the local head keeps the rest).
FINAL_DEADLINE = 30.0
# In a run directory this broker publishes: the generation of the manifest it last published
# (JSON), so that a restarted broker knows whether the store holds anything newer than its disk.
PUBLISHED_MARKER = ".vdl-published"
# Tries to claim a run taken over (read, fetch, conditional PUT) before the batch is refused.
CLAIM_TRIES = 3


def is_store_url(logdir: object) -> bool:
    """Whether ``logdir`` names a location in an object store (``s3://``, ``gs://``, ``az://``)."""
    return isinstance(logdir, str) and logdir.split("://", 1)[0] in SCHEMES and "://" in logdir


@dataclass(frozen=True)
class StoreLocation:
    """A parsed store URL: ``scheme://bucket/prefix``."""

    scheme: str
    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        """The URL, normalised (no trailing slash)."""
        tail = f"/{self.prefix}" if self.prefix else ""
        return f"{self.scheme}://{self.bucket}{tail}"


def parse_store_url(url: str, argument: str = "logdir") -> StoreLocation:
    """Parse ``scheme://bucket[/prefix]``.

    Raises:
        ValueError: not such a URL, or a prefix with empty, ``.`` or ``..`` parts; the message
            names ``argument`` and the value.
    """
    match = _URL_RE.match(url) if isinstance(url, str) else None
    if match is None:
        raise ValueError(
            f"{argument} must be a directory or a URL {'/'.join(s + '://' for s in SCHEMES)}"
            f"bucket/prefix, got {url!r:.80}"
        )
    prefix = (match.group(3) or "").strip("/")
    if prefix and any(p in ("", ".", "..") for p in prefix.split("/")):
        raise ValueError(f"{argument} has an empty, '.' or '..' part in its prefix: {url!r:.80}")
    return StoreLocation(match.group(1), match.group(2), prefix)


def cache_dir(url: str, base: str | os.PathLike[str] | None = None) -> Path:
    """The local directory a broker over the store URL ``url`` keeps its runs' heads in:
    ``base`` (default ``$VDL_STREAM_CACHE``, else ``~/.cache/vdl-stream``) / a hash of the URL."""
    location = parse_store_url(url)
    root = base or os.environ.get("VDL_STREAM_CACHE") or Path.home() / ".cache" / "vdl-stream"
    digest = hashlib.sha256(location.url.encode()).hexdigest()[:16]
    return Path(root) / f"{location.scheme}-{location.bucket}-{digest}"


class FencedError(StoreError):
    """A manifest PUT was refused because the manifest changed since this broker last read or
    wrote it: another broker took the run over (its lease) and published it. The run's fencing
    token is its manifest's ETag: every manifest PUT is conditional on the one this broker knows
    (``If-Match``, or ``If-None-Match: *`` for a run the store does not have), so a broker whose
    lease ran out (paused, cut off) can never replace the newer owner's manifest."""


@dataclass
class RequestCounts:
    """Requests sent to the store, by kind."""

    put: int = 0
    get: int = 0
    get_range: int = 0
    list: int = 0
    delete: int = 0
    failed: int = 0

    def total(self) -> int:
        """All requests sent (failed ones included)."""
        return self.put + self.get + self.get_range + self.list + self.delete


class ObstoreClient:
    """:class:`recorder.store.ObjectStore` over obstore, counting requests.

    Args:
        url: ``s3://bucket/prefix``, ``gs://...`` or ``az://...``.
        timeout: seconds a request may take.
        retries: how often obstore retries a failed request itself (then the caller backs off).

    Raises:
        ValueError: a bad URL.
        ImportError: obstore is not installed (the message says how to install it).
    """

    def __init__(self, url: str, *, timeout: float = 30.0, retries: int = 2) -> None:
        self.location = parse_store_url(url)
        try:
            import obstore
            from obstore.store import from_url
        except ImportError:
            raise ImportError(
                "a log directory in an object store needs obstore: pip install 'vdl-stream[cloud]'"
            ) from None
        self._obs = obstore
        options: dict[str, Any] = {"timeout": f"{timeout}s", "connect_timeout": "5s"}
        endpoint = next(
            (
                os.environ[k]
                for k in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
                if os.environ.get(k)
            ),
            "",
        )
        if self.location.scheme == "s3" and endpoint.startswith("http://"):
            options["allow_http"] = True  # a local MinIO or test server
        self._store = from_url(
            self.location.url,
            client_options=options,
            retry_config={
                "max_retries": retries,
                "retry_timeout": timedelta(seconds=timeout),
                "backoff": {
                    "init_backoff": timedelta(milliseconds=100),
                    "max_backoff": timedelta(seconds=2),
                    "base": 2,
                },
            },
        )
        self.counts = RequestCounts()
        self._lock = threading.Lock()
        # manifest key -> its ETag as this client last read or wrote it (None: known absent).
        # Bounded by the runs this broker opened for writing (a few per writer).
        self._etags: dict[str, str | None] = {}

    def _count(self, kind: str, n: int = 1) -> None:
        with self._lock:
            setattr(self.counts, kind, getattr(self.counts, kind) + n)

    def _call(self, kind: str, fn: Callable[[], Any], key: str, n: int = 1) -> Any:
        self._count(kind, n)
        try:
            return fn()
        except (FileNotFoundError, FencedError):
            raise
        except Exception as exc:
            from obstore.exceptions import NotFoundError

            if isinstance(exc, NotFoundError):
                raise FileNotFoundError(key) from None
            self._count("failed")
            raise StoreError(f"{self.location.url}/{key}: {_one_line(exc)}") from None

    def put(self, key: str, data: bytes | BinaryIO) -> None:
        """Write ``key`` whole, from bytes or an open file (past 5 MiB obstore uploads a file in
        5-MiB parts: counted as the requests a multipart upload sends, parts plus two).

        A manifest (``<run>/manifest.vdlm``) this client read or wrote before is written only if
        it is still the one it knows (the fencing of :class:`FencedError`).

        Raises:
            FencedError: that manifest changed since (another broker took the run over).
            StoreError: the store failed.
        """
        parts = 1
        if not isinstance(data, bytes):
            size = os.fstat(data.fileno()).st_size
            parts = 1 if size <= MULTIPART_BYTES else -(-size // MULTIPART_BYTES) + 2
        if not key.endswith("/" + MANIFEST) or key not in self._etags:
            self._call("put", lambda: self._obs.put(self._store, key, data), key, parts)
            return
        known = self._etags[key]
        mode: Any = "create" if known is None else {"e_tag": known}

        def put() -> Any:
            try:
                return self._obs.put(self._store, key, data, mode=mode)
            except Exception as exc:
                from obstore.exceptions import AlreadyExistsError, PreconditionError

                if isinstance(exc, (AlreadyExistsError, PreconditionError)):
                    self._etags.pop(key, None)  # read it again before anything else
                    raise FencedError(
                        f"{self.location.url}/{key}: another broker published this run since "
                        "(it holds the run's lease now)"
                    ) from None
                raise

        result = self._call("put", put, key, parts)
        self._etags[key] = result.get("e_tag") if isinstance(result, dict) else None

    def get(self, key: str) -> bytes:
        """Read ``key`` whole (a manifest's ETag is kept for the next conditional PUT)."""
        if not key.endswith("/" + MANIFEST):
            return self._call("get", lambda: bytes(self._obs.get(self._store, key).bytes()), key)

        def get() -> tuple[bytes, str | None]:
            result = self._obs.get(self._store, key)
            return bytes(result.bytes()), result.meta.get("e_tag")

        try:
            blob, etag = self._call("get", get, key)
        except FileNotFoundError:
            self._etags[key] = None
            raise
        self._etags[key] = etag
        return blob

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Read byte ranges of ``key`` (one request per range)."""
        starts = [a for a, _ in ranges]
        ends = [b for _, b in ranges]

        def fetch() -> list[bytes]:
            if len(ranges) == 1:
                return [bytes(self._obs.get_range(self._store, key, start=starts[0], end=ends[0]))]
            parts = self._obs.get_ranges(self._store, key, starts=starts, ends=ends)
            return [bytes(p) for p in parts]

        return self._call("get_range", fetch, key, len(ranges))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object under ``prefix`` (one request per 1,000 keys)."""

        def listing() -> list[ObjectInfo]:
            out = []
            for page in self._obs.list(self._store, prefix or None, chunk_size=1000):
                self._count("list")
                out.extend(
                    ObjectInfo(o["path"], o["size"], o.get("e_tag"), _seconds(o["last_modified"]))
                    for o in page
                )
            return out

        return self._call("list", listing, prefix or "/", 0)

    def delete(self, keys: Sequence[str]) -> None:
        """Delete ``keys``."""
        if keys:
            self._call("delete", lambda: self._obs.delete(self._store, list(keys)), keys[0])


def _seconds(when: Any) -> float | None:
    try:
        return float(when.timestamp())
    except (AttributeError, TypeError, ValueError, OverflowError):
        return None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


@dataclass(frozen=True)
class StoreStatistics:
    """What a :class:`StoreSync` did: requests, uploads, failures and what is not yet published."""

    url: str
    requests: dict
    objects_uploaded: int
    bytes_uploaded: int
    manifests_published: int
    objects_deleted: int
    runs_published: int
    runs_mirrored: int
    unpublished_runs: int
    failures: int
    last_error: str | None
    cache: dict = field(default_factory=dict)


class StoreSync:
    """Keeps a broker's local log directory and a store prefix in step.

    Publishes the runs written in ``local_dir`` (every ``upload_interval`` s; the head segment at
    most every ``head_interval`` s) and, with ``mirror``, mirrors the runs found in the store that
    are not written here (a listing every ``list_interval`` s; a run's manifest is read again only
    when the listing shows it changed). Every store call runs in a worker thread under a limiter.
    A failing store is retried with backoff and reported (a warning, :meth:`statistics`); the
    broker never waits on it, and the local heads keep everything until it is back.

    Args:
        client: the object store.
        local_dir: the broker's log directory (the cache of the store's runs).
        mirror: mirror the store's other runs (a serving broker); False for a writer's
            in-process broker.
        upload_interval: seconds between two looks at the local runs for something to publish.
        list_interval: seconds between two listings of the store.
        head_interval: seconds between two uploads of a live run's head segment (default:
            :data:`HEAD_INTERVAL` when the sync is made).
        cache_bytes: bytes of fetched block data kept for mirrors, all runs together (default:
            :data:`READ_CACHE_BYTES` when the sync is made).

    Raises:
        ValueError: an interval or ``cache_bytes`` is not positive (the message names it).
    """

    def __init__(
        self,
        client: Any,
        local_dir: str | os.PathLike[str],
        *,
        mirror: bool = True,
        upload_interval: float = UPLOAD_INTERVAL,
        list_interval: float = LIST_INTERVAL,
        head_interval: float | None = None,
        cache_bytes: int | None = None,
    ) -> None:
        head_interval = HEAD_INTERVAL if head_interval is None else head_interval
        cache_bytes = READ_CACHE_BYTES if cache_bytes is None else cache_bytes
        for name, value in (
            ("upload_interval", upload_interval),
            ("list_interval", list_interval),
            ("head_interval", head_interval),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes <= 0:
            raise ValueError(f"cache_bytes must be a positive int, got {cache_bytes!r}")
        self.client = client
        self.local_dir = Path(local_dir)
        self.mirror = mirror
        self.upload_interval = upload_interval
        self.list_interval = list_interval
        self.head_interval = head_interval
        self.cache = RangeCache(cache_bytes)
        self._limiter = trio.CapacityLimiter(STORE_THREADS)
        self._publishers: dict[str, RunPublisher] = {}
        self._mirrors: dict[str, RunMirror] = {}
        self._seen: dict[str, str | None] = {}  # run -> etag of the manifest last applied
        self._signatures: dict[str, tuple] = {}  # run -> local files when last published
        self._warned: OrderedDict[str, None] = OrderedDict()  # bounded: WARNED_KEYS
        self._failures = 0
        self._last_error: str | None = None
        self._failing = False
        # Runs named here uniquely (attach(run=None)): nothing to look up in the store, so a
        # store that is down never holds back their start.
        self.fresh_runs: set[str] = set()
        self._run_locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        # Runs whose manifest another broker replaced while this one published them (its lease
        # ran out): never published from here again unless taken over again (prepare_write).
        self._fenced: set[str] = set()
        # The first mirror round, if start_early_mirror began it for this store and directory
        # while the process was still importing: run() takes its result instead of starting over.
        self._early = _take_early(client, self.local_dir, cache_bytes) if mirror else None

    # -- the service ----------------------------------------------------------------------------

    async def run(
        self,
        closed: Callable[[], Awaitable[object]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Mirror the store once, report readiness, then publish and mirror until ``closed()``
        returns (the broker has closed its runs); then publish everything, heads included, within
        :data:`FINAL_DEADLINE` seconds, and return. A store that is down at start is reported;
        the broker starts anyway."""
        if self.mirror and not await self._adopt_early():
            await self._guarded(self._mirror_round)
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._loop, self._upload_round, self.upload_interval)
                if self.mirror:
                    nursery.start_soon(self._loop, self._mirror_round, self.list_interval)
                await closed()
                nursery.cancel_scope.cancel()
        finally:
            with trio.move_on_after(FINAL_DEADLINE, shield=True):
                await self._guarded(partial_final(self._upload_round))
            self.close()

    async def _loop(self, round_: Callable[[], Awaitable[None]], interval: float) -> None:
        delay = interval
        while True:
            await trio.sleep(delay)
            ok = await self._guarded(round_)
            delay = interval if ok else min(max(delay * 2, BACKOFF_MIN), BACKOFF_MAX)

    async def _guarded(self, round_: Callable[[], Awaitable[None]]) -> bool:
        try:
            await round_()
        except OSError as exc:
            self._failures += 1
            self._last_error = _one_line(exc)
            if not self._failing:
                log.warning(
                    "object store %s failing (%s); retrying with backoff, runs kept locally in %s",
                    self.client.location.url,
                    self._last_error,
                    self.local_dir,
                )
            self._failing = True
            return False
        if self._failing:
            log.warning("object store %s reachable again", self.client.location.url)
            self._failing = False
        return True

    async def _upload_round(self, final: bool = False) -> None:
        runs = await trio.to_thread.run_sync(self._local_runs, limiter=self._limiter)
        error: OSError | None = None
        async with trio.open_nursery() as nursery:
            for name in runs:

                async def one(name: str = name) -> None:
                    nonlocal error
                    try:
                        await trio.to_thread.run_sync(
                            self._publish, name, final, limiter=self._limiter
                        )
                    except OSError as exc:
                        error = exc
                    except (recorder.RecorderError, ValueError) as exc:
                        self._warn_once(name, f"cannot publish run {name!r}: {exc}")

                nursery.start_soon(one)
        if error is not None:
            raise error

    def _local_runs(self) -> list[str]:
        """Runs written here (not mirrors) whose files changed since they were published."""
        if not self.local_dir.is_dir():
            return []
        out = []
        for name in recorder.list_runs(self.local_dir):
            path = self.local_dir / name
            if RunMirror.is_mirror(str(path)) or name in self._fenced:
                continue
            holders = recorder.lock_holders(path / recorder.LOCK_NAME)
            if holders is None and name not in self._publishers:
                continue  # cannot tell whether another process writes it: leave it to that one
            if holders and os.getpid() not in holders:
                continue  # another process on this machine (an attach()) writes and publishes it
            try:
                signature = tuple(
                    sorted((e.name, e.stat().st_size) for e in os.scandir(path) if e.is_file())
                )
            except OSError:
                continue
            publisher = self._publishers.get(name)
            if signature != self._signatures.get(name) or publisher is None or publisher.pending():
                out.append(name)
        return out

    def _publish(self, name: str, final: bool) -> None:
        with self._run_lock(name):
            path = self.local_dir / name
            if RunMirror.is_mirror(str(path)):
                return
            publisher = self._publishers.get(name)
            if publisher is None:
                # A run left in the cache directory (by this host's earlier process): publish
                # it only if the store has not moved on since this host last published it
                # (another broker took it over meanwhile: its manifest is the truth).
                manifest = read_manifest(self.client, name)
                if manifest is not None and _published_here(path, manifest) is False:
                    self._fenced.add(name)
                    log.warning(
                        "run %r: the store holds a newer version of it (written through another "
                        "broker); this host's older copy is not published",
                        name,
                    )
                    return
                publisher = self._publisher(name, path)
                self._publishers[name] = publisher
            try:
                signature = tuple(
                    sorted((e.name, e.stat().st_size) for e in os.scandir(path) if e.is_file())
                )
            except FileNotFoundError:
                return  # the run directory went away (a local failure, not the store's)
            try:
                published = publisher.publish(final=final)
            except FencedError:
                # Another broker took the run over and published it: what this one holds of it
                # that the store has not is superseded; the bus gives the run up meanwhile.
                self._publishers.pop(name, None)
                self._fenced.add(name)
                log.warning(
                    "run %r: another broker published it since (its lease moved there); this "
                    "broker stops publishing it",
                    name,
                )
                return
            if published:
                _mark_published(path, publisher.generation)
            if not publisher.pending():
                self._signatures[name] = signature

    async def _mirror_round(self) -> None:
        infos = await trio.to_thread.run_sync(self.client.list, "", limiter=self._limiter)
        error: OSError | None = None
        async with trio.open_nursery() as nursery:
            for name, info in self._changed(infos).items():

                async def one(name: str = name, info: ObjectInfo = info) -> None:
                    nonlocal error
                    try:
                        await trio.to_thread.run_sync(
                            self._mirror_one, name, info, limiter=self._limiter
                        )
                    except OSError as exc:
                        error = exc

                nursery.start_soon(one)
        if error is not None:
            raise error

    def _changed(self, infos: list[ObjectInfo]) -> dict[str, ObjectInfo]:
        """The runs of a listing whose manifest changed since this sync last mirrored them
        (run name -> the manifest's listing entry); objects of no run are warned about once."""
        runs, foreign = find_runs(infos)
        for key in foreign:
            self._warn_once(
                f"foreign:{key}",
                f"skipping {self.client.location.url}/{key}: not an object of a vdl-stream run",
            )
        return {
            name: info
            for name, info in runs.items()
            if not (self._seen.get(name) == (info.etag or str(info.size)) and name in self._mirrors)
        }

    def _mirror_one(self, name: str, info: ObjectInfo) -> None:
        """Mirror run ``name`` (blocking) as its manifest ``info`` lists it; a run that cannot be
        read is skipped with a warning (until its manifest changes). OSError: the store failed."""
        try:
            self._refresh(name)
        except (ManifestError, recorder.RecorderError, ValueError) as exc:
            self._warn_once(f"run:{name}", f"skipping run {name!r} in the store: {exc}")
        self._seen[name] = info.etag or str(info.size)

    def _mirror_blocking(self) -> None:
        """One mirror round without trio (the early round of :func:`start_early_mirror`): the
        listing, then the changed runs in :data:`STORE_THREADS` threads."""
        infos = self.client.list("")
        with ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="vdl-store") as pool:
            for done in [
                pool.submit(self._mirror_one, n, i) for n, i in self._changed(infos).items()
            ]:
                done.result()  # an OSError: the round failed; StoreSync.run mirrors again

    async def _adopt_early(self) -> bool:
        """Take the result of the early first round (:func:`start_early_mirror`), waiting for it
        if it is still running; False when there is none or it failed (run() mirrors itself)."""
        early, self._early = self._early, None
        if early is None:
            return False
        # Abandoned on cancel (a serve stopped while starting): joining has no effect to undo.
        await trio.to_thread.run_sync(early.join, limiter=self._limiter, abandon_on_cancel=True)
        done = early.sync
        if done is None:
            return False
        self.client, self.cache = done.client, done.cache  # the mirrors read through them
        self._mirrors, self._seen, self._warned = done._mirrors, done._seen, done._warned
        return True

    def _refresh(self, name: str) -> None:
        try:
            recorder_name = _check_run_name(name)
        except ValueError as exc:
            raise ManifestError(str(exc)) from None
        with self._run_lock(recorder_name):
            path = self.local_dir / name
            mirror = self._mirrors.get(name)
            if mirror is None:
                if path.exists() and not RunMirror.is_mirror(str(path)):
                    return  # written here: this broker publishes it
                if path.exists():  # a mirror left by an earlier process: its holes are unknown
                    shutil.rmtree(path)
                mirror = RunMirror(self.client, name, str(path), self.cache)
                self._mirrors[name] = mirror
            mirror.refresh()

    def prepare_write(self, path: str | os.PathLike[str], *, taken_over: bool = False) -> None:
        """Make ``path`` ready for a local writer (blocking; the broker calls it before opening a
        run for writing): a mirror is fetched whole and becomes a local run; a run that exists
        only in the store is downloaded. Then the run is published from here.

        ``taken_over``: the broker has just taken the run's lease (``serve --bus``; another
        broker, on another host, may have written it since): the run continues from the store,
        which is the truth, unless this broker published its newest manifest itself; and the
        manifest is claimed (:meth:`_claim`), so the broker that had the run can no longer
        publish it.

        Raises:
            OSError: the store failed (the broker refuses the batch as retryable).
        """
        path = Path(path)
        name = path.relative_to(self.local_dir).as_posix()
        if taken_over:
            for attempt in range(CLAIM_TRIES):
                try:
                    with self._run_lock(name):
                        self._take_over(name, path)
                    return
                except FencedError:
                    # The old owner published between our read and our claim: read again.
                    if attempt == CLAIM_TRIES - 1:
                        raise
        with self._run_lock(name):
            mirror = self._mirrors.pop(name, None)
            publisher = self._publisher(name, path)
            if mirror is not None or RunMirror.is_mirror(str(path)):
                if mirror is None:  # left by an earlier process
                    shutil.rmtree(path)
                    publisher.adopt(download_run(self.client, name, str(path)))
                else:
                    mirror.hydrate()
                    publisher.adopt(read_manifest(self.client, name))
            elif name in self.fresh_runs and name not in self._publishers:
                publisher.adopt(None)
            elif name not in self._publishers and not _has_segments(path):
                publisher.adopt(download_run(self.client, name, str(path)))
            else:
                return
            self._publishers[name] = publisher

    def publish_run(self, path: str | os.PathLike[str]) -> None:
        """Publish the run in ``path`` now, head included (blocking): the broker gives the run up
        (its bus lease), and the broker that takes it next continues from the store.

        Raises:
            OSError: the store failed.
        """
        self._publish(Path(path).relative_to(self.local_dir).as_posix(), True)

    def _take_over(self, name: str, path: Path) -> None:
        """Continue run ``name`` from the store in ``path`` and claim it (hold its run lock)."""
        mirror = self._mirrors.pop(name, None)
        if mirror is not None:
            mirror.close()
        manifest = read_manifest(self.client, name)  # its ETag is the claim's condition
        publisher = self._publishers.get(name)
        current = manifest is None or (
            not RunMirror.is_mirror(str(path))
            and _has_segments(path)
            and (
                (publisher is not None and publisher.generation >= manifest.generation)
                or _published_here(path, manifest) is True
            )
        )
        if not current:
            assert manifest is not None
            # The store has what this host has not (another broker wrote the run since, or
            # this host only mirrored it): fetch its files whole, in a fresh directory.
            shutil.rmtree(path, ignore_errors=True)
            download_files(self.client, manifest, str(path))
        publisher = self._publisher(name, path)
        publisher.adopt(manifest)
        if manifest is not None:
            self._claim(name, path, publisher, manifest)
        self._publishers[name] = publisher
        self._fenced.discard(name)

    def _publisher(self, name: str, path: Path) -> RunPublisher:
        """A publisher of run ``name`` from ``path`` that records each manifest it is about to
        PUT in the run directory (:func:`_mark_published`)."""
        publisher = RunPublisher(
            self.client,
            name,
            str(path),
            head_interval=self.head_interval,
            announce=lambda manifest: _mark_published(path, publisher.generation, pending=manifest),
        )
        return publisher

    def _claim(self, name: str, path: Path, publisher: RunPublisher, manifest: Manifest) -> None:
        """PUT ``manifest`` again as a new generation, conditional on the one just read: from
        then on every manifest PUT of the broker that had the run fails (:class:`FencedError`).

        Raises:
            FencedError: that broker published once more between the read and this PUT.
        """
        claim = Manifest(name, manifest.files, manifest.generation + 1, manifest.written)
        self.client.put(manifest_key(name), claim.encode())
        publisher.generation = claim.generation
        _mark_published(path, claim.generation)

    def _run_lock(self, name: str) -> threading.Lock:
        with self._locks_lock:
            return self._run_locks.setdefault(name, threading.Lock())

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned[key] = None
            while len(self._warned) > WARNED_KEYS:  # a prefix full of junk may warn again
                self._warned.popitem(last=False)
            log.warning("%s", message)

    def statistics(self) -> StoreStatistics:
        """Requests sent, uploads, mirrors, failures and runs with unpublished data."""
        pubs = list(self._publishers.values())
        cache = self.cache.statistics()
        return StoreStatistics(
            url=self.client.location.url,
            requests=dict(vars(self.client.counts)),
            objects_uploaded=sum(p.stats.objects for p in pubs),
            bytes_uploaded=sum(p.stats.bytes for p in pubs),
            manifests_published=sum(p.stats.manifests for p in pubs),
            objects_deleted=sum(p.stats.deleted for p in pubs),
            runs_published=len(pubs),
            runs_mirrored=len(self._mirrors),
            unpublished_runs=sum(p.pending() for p in pubs),
            failures=self._failures,
            last_error=self._last_error,
            cache=dict(vars(cache)),
        )

    def close(self) -> None:
        """Stop fetching for the mirrors."""
        for mirror in self._mirrors.values():
            mirror.close()


#: Early first mirror rounds (start_early_mirror) not yet taken, by (store URL, local directory).
_EARLY: dict[tuple[str, Path], _EarlyMirror] = {}
_EARLY_LOCK = threading.Lock()


def start_early_mirror(url: str, local_dir: str | os.PathLike[str]) -> None:
    """Begin the first look at store ``url`` of a broker that will keep its runs in
    ``local_dir``, in a thread, now: ``vdl-stream serve`` calls it before it imports the web
    server, so the listing and the runs' manifests, heads and block headers are fetched while
    Python is still importing (the requests wait on the network, the imports on the CPU).

    The :class:`StoreSync` made next for the same store and directory takes the result as its
    first mirror round (waiting for it if need be), so nothing is fetched twice. Best effort: if
    the early round fails, that StoreSync mirrors by itself, and reports the failure as usual.

    Raises:
        ValueError: ``url`` is not a store URL.
    """
    key = (parse_store_url(url).url, Path(local_dir))
    with _EARLY_LOCK:
        if key in _EARLY:
            return
        early = _EARLY[key] = _EarlyMirror(url, Path(local_dir), READ_CACHE_BYTES)
    early.start()


class _EarlyMirror(threading.Thread):
    """The thread of :func:`start_early_mirror`: a StoreSync of its own, mirrored once."""

    def __init__(self, url: str, local_dir: Path, cache_bytes: int) -> None:
        super().__init__(name="vdl-stream early mirror", daemon=True)
        self.url, self.local_dir, self.cache_bytes = url, local_dir, cache_bytes
        #: the mirrored sync once the round succeeded; None before, or if it failed
        self.sync: StoreSync | None = None

    def run(self) -> None:
        try:
            # mirror=False: this sync must not take the early round (its own) from _EARLY
            client = ObstoreClient(self.url)
            sync = StoreSync(client, self.local_dir, mirror=False, cache_bytes=self.cache_bytes)
            sync._mirror_blocking()
        except Exception as exc:  # the StoreSync that takes this round mirrors again, and reports
            log.debug("the early look at %s failed: %s", self.url, _one_line(exc))
            return
        self.sync = sync


def _take_early(client: Any, local_dir: Path, cache_bytes: int) -> _EarlyMirror | None:
    """The early round begun for ``client``'s store and ``local_dir``, if any (taken once), and
    only if made with the same read cache budget."""
    location = getattr(client, "location", None)
    if location is None or not _EARLY:
        return None
    with _EARLY_LOCK:
        early = _EARLY.pop((location.url, local_dir), None)
    if early is None or early.cache_bytes != cache_bytes or type(client) is not ObstoreClient:
        return None
    return early


def _mark_published(path: Path, generation: int, pending: Manifest | None = None) -> None:
    """Record in run directory ``path`` that this host published manifest ``generation``, and
    the manifest it is about to PUT (``pending``), if any."""
    record: dict[str, Any] = {"generation": generation}
    if pending is not None:
        record["pending"] = [pending.generation, _files_digest(pending)]
    with contextlib.suppress(OSError):  # only a shortcut: without it a take-over downloads
        tmp = path / (PUBLISHED_MARKER + ".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path / PUBLISHED_MARKER)


def _files_digest(manifest: Manifest) -> str:
    """A digest of the files ``manifest`` names (their object keys name their contents)."""
    names = json.dumps([[f.name, f.key, f.size, f.tail] for f in manifest.files])
    return hashlib.blake2b(names.encode(), digest_size=8).hexdigest()


def _published_here(path: Path, manifest: Manifest) -> bool | None:
    """Whether the store's ``manifest`` of the run in ``path`` is one this host published: the
    generation it recorded, or the one it was about to PUT when it stopped (same generation and
    files: a broker that took the run over claims it with the files it found, never these).
    None when this host recorded nothing of the run."""
    try:
        record = json.loads((path / PUBLISHED_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or type(record.get("generation")) is not int:
        return None
    pending = record.get("pending")
    return record["generation"] == manifest.generation or pending == [
        manifest.generation,
        _files_digest(manifest),
    ]


def partial_final(round_: Callable[..., Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """``round_`` with ``final=True``: heads published whatever their interval."""

    async def final() -> None:
        await round_(final=True)

    return final


def _check_run_name(name: str) -> str:
    from .codec import check_run_name

    return check_run_name(name)


def _has_segments(path: Path) -> bool:
    try:
        return any(recorder.catalog.SEGMENT_RE.match(n) for n in os.listdir(path))
    except FileNotFoundError:
        return False


# -- blocking helpers for the command line (export, replay, import) ------------------------------


@contextlib.contextmanager
def mirrored(url: str, runs: Sequence[str] | None = None) -> Iterator[Path]:
    """A temporary local log directory mirroring the runs under ``url`` (or only ``runs``),
    for the commands that read runs; removed on exit.

    Raises:
        ValueError: a bad URL. ImportError: obstore is missing. OSError: the store failed.
    """
    client = ObstoreClient(url)
    cache = RangeCache()
    with tempfile.TemporaryDirectory(prefix="vdl-stream-mirror-") as tmp:
        mirrors = []
        try:
            if runs is None:
                found, foreign = find_runs(client.list(""))
                for key in foreign:
                    log.warning("skipping %s/%s: not an object of a vdl-stream run", url, key)
                runs = sorted(found)
            for name in runs:
                mirror = RunMirror(client, name, os.path.join(tmp, *name.split("/")), cache)
                mirrors.append(mirror)
                try:
                    if not mirror.refresh():
                        raise recorder.NotARunError(f"{url}: no run {name!r} in the store")
                except ManifestError as exc:
                    log.warning("skipping run %r in the store: %s", name, exc)
            yield Path(tmp)
        finally:
            for mirror in mirrors:
                mirror.close()


def split_run_url(url: str) -> tuple[str, str | None]:
    """``(log directory URL, run name)`` when ``url`` names a run (it holds a manifest), else
    ``(url, None)``: a log directory of runs.

    Raises:
        ValueError: a bad URL. OSError: the store failed.
    """
    location = parse_store_url(url)
    try:
        blob = ObstoreClient(location.url).get(MANIFEST)
    except FileNotFoundError:
        return location.url, None
    try:
        run = json.loads(blob)["run"]
    except (ValueError, KeyError, TypeError):
        raise ManifestError(f"{url}/{MANIFEST}: not a vdl-stream manifest") from None
    if not isinstance(run, str) or not location.prefix.endswith(run):
        raise ManifestError(f"{url}/{MANIFEST}: names run {run!r}, not this location")
    parent = location.prefix[: -len(run)].rstrip("/")
    return StoreLocation(location.scheme, location.bucket, parent).url, run


@contextlib.contextmanager
def local_path(path: str, *, run_only: bool = False) -> Iterator[str]:
    """``path`` itself, or for a store URL a temporary mirror of it (a run, or a log directory of
    runs), for the commands that read runs (``export``, ``replay``).

    Raises:
        NotARunError: ``run_only`` and the URL names no run.
    """
    if not is_store_url(path):
        yield path
        return
    logdir, run = split_run_url(path)
    if run is None and run_only:
        raise recorder.NotARunError(f"{path}: not a run (no {MANIFEST} there)")
    with mirrored(logdir, None if run is None else [run]) as tmp:
        yield str(tmp if run is None else tmp.joinpath(*run.split("/")))


def publish_all(url: str, local_dir: str | os.PathLike[str], *, new_only: bool = False) -> int:
    """Publish every run under ``local_dir`` to ``url`` whole (heads too); return how many.

    Raises:
        FileExistsError: ``new_only`` and a run exists in the store already (nothing published).
        OSError: the store failed (the local runs stay; calling again resumes).
    """
    client = ObstoreClient(url)
    names = recorder.list_runs(local_dir)
    if new_only:
        for name in names:
            if read_manifest(client, name) is not None:
                raise FileExistsError(f"run {name!r} already exists in {url}")
    for name in names:
        RunPublisher(client, name, os.path.join(local_dir, *name.split("/"))).publish(final=True)
    return len(names)
