"""System telemetry: one blocking sampler for GPUs (through NVML) and the host (through psutil).

The sampler is deliberately I/O-thin and synchronous: `TelemetrySampler.sample()` makes a handful of
NVML and psutil calls and returns one sample map (docs/telemetry.md). The caller decides when to
sample and runs it off its event loop (``trio.to_thread.run_sync``); this module knows nothing about
trio, transports or dashboards.

Telemetry travels on the scalar path (issue 16): `sample_points` turns a sample into one scalar
point per field under the reserved tag namespace ``@telemetry/<host>/rank<r>/<field>``
(docs/protocol.md, "Telemetry scalars"), so it is stored, fanned out, downsampled and exported as
scalar columns. Runs written before hold ``telemetry`` events instead; the conversions between the
two forms live here and nowhere else: `columns_from_events` (old events read as scalar columns),
`legacy_view` (the event form, for readers such as the alert detectors that take events).

NVML comes from the ``pynvml`` module of the ``nvidia-ml-py`` package. It is imported lazily, inside
the sampler, so that a machine without NVIDIA's library still gets CPU/RAM telemetry and so that tests
can put a fake module in ``sys.modules["pynvml"]``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil

from .codec import RESERVED_TAG_PREFIX, ScalarColumns

__all__ = [
    "TelemetrySampler",
    "columns_from_events",
    "distributed_env",
    "is_telemetry_tag",
    "legacy_view",
    "parse_tag",
    "sample_points",
    "scalar_tag",
    "series",
]

logger = logging.getLogger("vdl_stream.telemetry")

# Interval clock for rates. A module attribute so tests can drive it; wall time is time.time().
_clock: Callable[[], float] = time.monotonic


def distributed_env() -> tuple[int, int, int]:
    """Read this process's place in a distributed job from the environment.

    torch.distributed (torchrun) sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; PaddlePaddle's
    launcher sets ``PADDLE_TRAINER_ID`` and ``PADDLE_TRAINERS_NUM``. The torch names win where both
    are set. Unset variables give a single-process job: rank 0, local rank 0, world size 1.

    Returns:
        ``(rank, local_rank, world_size)``.

    Raises:
        ValueError: a variable is set but is not a non-negative integer (or, for the world size, a
            positive one); the message names the variable and its value.
    """
    rank = _env_int(("RANK", "PADDLE_TRAINER_ID"), default=0, minimum=0)
    local_rank = _env_int(("LOCAL_RANK",), default=0, minimum=0)
    world_size = _env_int(("WORLD_SIZE", "PADDLE_TRAINERS_NUM"), default=1, minimum=1)
    return rank, local_rank, world_size


def _env_int(names: tuple[str, ...], *, default: int, minimum: int) -> int:
    for name in names:
        raw = os.environ.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(
                f"environment variable {name} must be an integer, got {raw!r}"
            ) from None
        if value < minimum:
            raise ValueError(f"environment variable {name} must be >= {minimum}, got {raw!r}")
        return value
    return default


class _Gpu:
    """Per-device state: the NVML handle, the calls that failed once, and counter baselines."""

    __slots__ = ("handle", "index", "off", "pcie_prev", "prefix")

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.prefix = f"gpu{index}/"
        # Names of NVML calls that raised once for this device; they are never made again.
        self.off: set[str] = set()
        # (monotonic time, tx bytes, rx bytes) from the previous PCIe byte-counter read.
        self.pcie_prev: tuple[float, int, int] | None = None


class TelemetrySampler:
    """Samples GPU and host telemetry into ``telemetry`` events.

    Construction initialises NVML (when ``gpus`` is true) and reads the static device list, which
    can block for seconds on GPUs without persistence mode, so construct it off the event loop
    too. Every ``sample()`` then costs a few dozen NVML calls per GPU and a few psutil calls. A call that a
    device does not support (any ``NVMLError``) is remembered and never made again, and its field is
    left out of the events; nothing is faked. Without NVML (no ``pynvml`` module, no driver, no GPU)
    the sampler logs one info line and produces host fields only.

    The sampler is blocking and thread-safe (a lock serialises ``sample()`` and ``close()``); run it
    in a worker thread, not on an event loop.

    Args:
        host: host name put in every event; defaults to ``socket.gethostname()``.
        rank: the process's rank in a distributed job (see `distributed_env`), put in every event.
        gpus: sample GPUs through NVML; ``False`` skips NVML entirely.
        pid: the process whose RSS, CPU % and GPU memory are reported; defaults to this process.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: ``host`` is empty, ``rank`` is negative, or ``pid`` is not a running process.
    """

    def __init__(
        self,
        *,
        host: str | None = None,
        rank: int = 0,
        gpus: bool = True,
        pid: int | None = None,
    ) -> None:
        if host is not None and not isinstance(host, str):
            raise TypeError(f"host must be a str or None, got {host!r}")
        if host is not None and not host:
            raise ValueError("host must be a non-empty str, got ''")
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise TypeError(f"rank must be an int, got {rank!r}")
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank!r}")
        if not isinstance(gpus, bool):
            raise TypeError(f"gpus must be a bool, got {gpus!r}")
        if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
            raise TypeError(f"pid must be an int or None, got {pid!r}")
        if pid is not None and pid <= 0:
            raise ValueError(f"pid must be > 0, got {pid!r}")

        self.host = host if host is not None else socket.gethostname()
        self.rank = rank
        self.pid = os.getpid() if pid is None else pid
        try:
            self._proc: psutil.Process | None = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            raise ValueError(f"pid must be a running process, got {pid!r}") from None

        self._lock = threading.Lock()
        self._closed = False
        self._nvml: Any = None  # the pynvml module, once nvmlInit succeeded
        self._nvml_errors: tuple[type[BaseException], ...] = ()
        self._gpus: list[_Gpu] = []
        self._devices: list[dict[str, Any]] = []
        # Host baselines for rates: (monotonic time, counters...) of the previous sample.
        self._cpu_prev: tuple[float, float] | None = None  # (busy seconds, total seconds)
        self._proc_cpu_primed = False
        self._disk_prev: tuple[float, int, int] | None = None
        self._net_prev: tuple[float, int, int] | None = None
        if gpus:
            self._init_nvml()

    # ------------------------------------------------------------------ public API

    def devices(self) -> list[dict[str, Any]]:
        """Describe the sampled GPUs once, so a page can label them.

        Returns:
            One dict per GPU, in NVML index order: ``{"index": int, "name": str | None,
            "uuid": str | None, "mem_total": float | None}`` (``mem_total`` in bytes). A value
            the device would not report is ``None``. An empty list without NVML.
        """
        return [dict(d) for d in self._devices]

    def sample(self) -> dict[str, Any]:
        """Take one sample.

        Returns:
            ``{"kind": "telemetry", "tag": None, "step": None, "wall": float, "host": str,
            "rank": int, "fields": {name: float}}``. Field names are listed in docs/telemetry.md.
            Rates and CPU percentages need two samples, so the first sample leaves them out.

        Raises:
            RuntimeError: the sampler is closed.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("TelemetrySampler.sample() called after close()")
            wall = time.time()
            now = _clock()
            fields: dict[str, float] = {}
            for gpu in self._gpus:
                self._sample_gpu(gpu, now, fields)
            self._sample_host(now, fields)
        return {
            "kind": "telemetry",
            "tag": None,
            "step": None,
            "wall": wall,
            "host": self.host,
            "rank": self.rank,
            "fields": fields,
        }

    def close(self) -> None:
        """Release NVML (``nvmlShutdown``) if this sampler initialised it. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            nvml, self._nvml = self._nvml, None
            self._gpus = []
            if nvml is not None:
                try:
                    nvml.nvmlShutdown()
                except self._nvml_errors as exc:
                    logger.debug("nvmlShutdown failed: %s", exc)

    def __enter__(self) -> TelemetrySampler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ NVML

    def _init_nvml(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            logger.info("GPU telemetry off: the pynvml module (nvidia-ml-py) is missing (%s)", exc)
            return
        errors: tuple[type[BaseException], ...] = (pynvml.NVMLError,)
        # Unversioned process-list calls raise this (not an NVMLError) on a too-old driver.
        mismatch = getattr(pynvml, "NVMLLibraryMismatchError", None)
        if isinstance(mismatch, type):
            errors += (mismatch,)
        try:
            pynvml.nvmlInit()
        except errors as exc:
            logger.info("GPU telemetry off: NVML is not available (%s)", exc)
            return
        try:
            count = pynvml.nvmlDeviceGetCount()
        except errors as exc:
            logger.info("GPU telemetry off: NVML cannot count the GPUs (%s)", exc)
            _shutdown_quietly(pynvml, errors)
            return
        self._nvml = pynvml
        self._nvml_errors = errors
        for index in range(count):
            # One unusable GPU (lost, or hidden from this container) must not hide the others;
            # the rest keep their NVML index, so gpu{i} always means nvidia-smi's GPU i.
            try:
                self._gpus.append(_Gpu(index, pynvml.nvmlDeviceGetHandleByIndex(index)))
            except errors as exc:
                logger.info("GPU telemetry: skipping GPU %d, NVML gives no handle (%s)", index, exc)
        for gpu in self._gpus:
            mem = self._memory_info(gpu)
            self._devices.append(
                {
                    "index": gpu.index,
                    "name": _text(self._call(gpu, "name", pynvml.nvmlDeviceGetName)),
                    "uuid": _text(self._call(gpu, "uuid", pynvml.nvmlDeviceGetUUID)),
                    "mem_total": float(mem.total) if mem is not None else None,
                }
            )
        if not self._gpus:
            logger.info("GPU telemetry off: NVML found no GPU")

    def _call(self, gpu: _Gpu, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn(handle, *args)``; on an NVML error, disable ``key`` for this device."""
        if key in gpu.off:
            return None
        try:
            return fn(gpu.handle, *args)
        except self._nvml_errors as exc:
            gpu.off.add(key)
            logger.debug("gpu%d: %s not available, no longer asked: %r", gpu.index, key, exc)
            return None

    def _memory_info(self, gpu: _Gpu) -> Any:
        # v2 reports "used" without the driver-reserved memory, as nvidia-smi does; v1 includes it.
        nvml = self._nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None and "mem_v2" not in gpu.off:
            mem = self._call(gpu, "mem_v2", nvml.nvmlDeviceGetMemoryInfo, version)
            if mem is not None:
                return mem
        return self._call(gpu, "mem", nvml.nvmlDeviceGetMemoryInfo)

    def _sample_gpu(self, gpu: _Gpu, now: float, out: dict[str, float]) -> None:
        nvml = self._nvml
        p = gpu.prefix
        call = self._call

        rates = call(gpu, "util", nvml.nvmlDeviceGetUtilizationRates)
        if rates is not None:
            out[p + "util"] = float(rates.gpu)
            out[p + "mem_util"] = float(rates.memory)
        mem = self._memory_info(gpu)
        if mem is not None:
            out[p + "mem_used"] = float(mem.used)
            out[p + "mem_total"] = float(mem.total)

        temp = None
        if hasattr(nvml, "nvmlDeviceGetTemperatureV"):
            temp = call(gpu, "temp_v", nvml.nvmlDeviceGetTemperatureV, nvml.NVML_TEMPERATURE_GPU)
            # nvidia-ml-py 12.570+ returns the int; accept the v1 struct should a version return it.
            temp = getattr(temp, "temperature", temp)
        if temp is None:
            temp = call(gpu, "temp", nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU)
        if temp is not None:
            out[p + "temp"] = float(temp)

        power = call(gpu, "power", nvml.nvmlDeviceGetPowerUsage)
        if power is not None:
            out[p + "power"] = power / 1000.0  # mW
        limit = call(gpu, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit)
        if limit is not None:
            out[p + "power_limit"] = limit / 1000.0

        for name, clock in (
            ("clock_sm", nvml.NVML_CLOCK_SM),
            ("clock_mem", nvml.NVML_CLOCK_MEM),
            ("clock_graphics", nvml.NVML_CLOCK_GRAPHICS),
        ):
            value = call(gpu, name, nvml.nvmlDeviceGetClockInfo, clock)
            if value is not None:
                out[p + name] = float(value)

        fan = call(gpu, "fan", nvml.nvmlDeviceGetFanSpeed)
        if fan is not None:
            out[p + "fan"] = float(fan)

        self._sample_pcie(gpu, now, out)

        for name, kind in (
            ("ecc_corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("ecc_uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            value = call(gpu, name, nvml.nvmlDeviceGetTotalEccErrors, kind, nvml.NVML_VOLATILE_ECC)
            if value is not None:
                out[p + name] = float(value)

        reasons = None
        if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons"):
            reasons = call(gpu, "throttle_ev", nvml.nvmlDeviceGetCurrentClocksEventReasons)
        if reasons is None and hasattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons"):
            reasons = call(gpu, "throttle", nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        if reasons is not None:
            out[p + "throttle"] = float(reasons)

        self._sample_proc_mem(gpu, out)

    def _sample_pcie(self, gpu: _Gpu, now: float, out: dict[str, float]) -> None:
        # nvmlDeviceGetPcieThroughput measures over a 20 ms window inside the call, so two calls per
        # GPU would cost 40 ms a sample. The cumulative byte counters (field values 197/198, newer
        # drivers) cost microseconds; rates come from two reads, like the host I/O rates.
        nvml = self._nvml
        p = gpu.prefix
        tx_id = getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", None)
        if tx_id is not None and "pcie_count" not in gpu.off:
            counts = self._pcie_counters(gpu, tx_id, nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES)
            if counts is not None:
                tx, rx = counts
                prev, gpu.pcie_prev = gpu.pcie_prev, (now, tx, rx)
                if prev is not None and now > prev[0] and tx >= prev[1] and rx >= prev[2]:
                    out[p + "pcie_tx"] = (tx - prev[1]) / (now - prev[0])
                    out[p + "pcie_rx"] = (rx - prev[2]) / (now - prev[0])
                return
        for name, counter in (
            ("pcie_tx", nvml.NVML_PCIE_UTIL_TX_BYTES),
            ("pcie_rx", nvml.NVML_PCIE_UTIL_RX_BYTES),
        ):
            kib_s = self._call(gpu, name, nvml.nvmlDeviceGetPcieThroughput, counter)
            if kib_s is not None:
                out[p + name] = kib_s * 1024.0

    def _pcie_counters(self, gpu: _Gpu, tx_id: int, rx_id: int) -> tuple[int, int] | None:
        nvml = self._nvml
        values = self._call(gpu, "pcie_count", nvml.nvmlDeviceGetFieldValues, [tx_id, rx_id])
        if values is None:
            return None
        counts = []
        for value in values:
            number = _field_value(nvml, value)
            if number is None:
                gpu.off.add("pcie_count")
                logger.debug("gpu%d: PCIe byte counters not available, using throughput", gpu.index)
                return None
            counts.append(int(number))
        return counts[0], counts[1]

    def _sample_proc_mem(self, gpu: _Gpu, out: dict[str, float]) -> None:
        # A process with both a compute and a graphics context is listed in both lists with the
        # same memory, so the lists are combined with max, not summed.
        nvml = self._nvml
        found: list[int] = []
        answered = False
        for key, fn in (
            ("procs_compute", nvml.nvmlDeviceGetComputeRunningProcesses),
            ("procs_graphics", nvml.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            procs = self._call(gpu, key, fn)
            if procs is None:
                continue
            answered = True
            mine = [p.usedGpuMemory for p in procs if p.pid == self.pid]
            if any(m is None for m in mine):
                # NVML could not tell this process's memory (e.g. WDDM): unknown, not zero.
                return
            found.append(sum(mine))
        if answered:
            out[gpu.prefix + "proc_mem"] = float(max(found))

    # ------------------------------------------------------------------ host (psutil)

    def _sample_host(self, now: float, out: dict[str, float]) -> None:
        busy, total = _cpu_busy_total(psutil.cpu_times())
        prev_cpu, self._cpu_prev = self._cpu_prev, (busy, total)
        if prev_cpu is not None and total > prev_cpu[1]:
            pct = 100.0 * (busy - prev_cpu[0]) / (total - prev_cpu[1])
            # Rounded as psutil rounds it; the float sums leave residues like 2.8e-11 otherwise.
            out["cpu/percent"] = round(min(100.0, max(0.0, pct)), 1)

        vm = psutil.virtual_memory()
        out["ram/used"] = float(vm.used)
        out["ram/total"] = float(vm.total)
        out["ram/percent"] = float(vm.percent)

        if self._proc is not None:
            try:
                with self._proc.oneshot():
                    out["proc/rss"] = float(self._proc.memory_info().rss)
                    cpu = self._proc.cpu_percent(None)
                if self._proc_cpu_primed:
                    out["proc/cpu_percent"] = float(cpu)
                self._proc_cpu_primed = True
            except psutil.Error as exc:
                # The process is gone or hidden from us: stop reporting it, keep the rest.
                logger.debug("process %d no longer readable: %r", self.pid, exc)
                out.pop("proc/rss", None)
                self._proc = None

        disk = psutil.disk_io_counters()
        if disk is not None:
            prev, self._disk_prev = self._disk_prev, (now, disk.read_bytes, disk.write_bytes)
            _rates(out, prev, self._disk_prev, "disk/read_bytes_per_s", "disk/write_bytes_per_s")
        net = psutil.net_io_counters()
        if net is not None:
            prev, self._net_prev = self._net_prev, (now, net.bytes_sent, net.bytes_recv)
            _rates(out, prev, self._net_prev, "net/sent_bytes_per_s", "net/recv_bytes_per_s")


def _rates(
    out: dict[str, float],
    prev: tuple[float, int, int] | None,
    cur: tuple[float, int, int],
    name_a: str,
    name_b: str,
) -> None:
    """Put per-second rates of two counters into ``out``; skip a first read or a counter reset."""
    if prev is None or cur[0] <= prev[0]:
        return
    dt = cur[0] - prev[0]
    if cur[1] >= prev[1]:
        out[name_a] = (cur[1] - prev[1]) / dt
    if cur[2] >= prev[2]:
        out[name_b] = (cur[2] - prev[2]) / dt


def _cpu_busy_total(times: Any) -> tuple[float, float]:
    """Busy and total CPU seconds from ``psutil.cpu_times()``, counted the way psutil does.

    Computed here rather than with ``psutil.cpu_percent()`` because that keeps one baseline per
    process, which any other caller of it would move.
    """
    total = sum(times)
    # On Linux guest time is already included in user/nice time.
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


def _field_value(nvml: Any, value: Any) -> float | int | None:
    """The number in an ``nvmlFieldValue_t``, or None when NVML returned an error for it."""
    if value.nvmlReturn != getattr(nvml, "NVML_SUCCESS", 0):
        return None
    member = {
        0: "dVal",
        1: "uiVal",
        2: "ulVal",
        3: "ullVal",
        4: "sllVal",
        5: "siVal",
        6: "usVal",
    }.get(value.valueType)
    if member is None:
        return None
    return getattr(value.value, member)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):  # nvidia-ml-py before 11.5 returned bytes
        return value.decode("utf-8", "replace")
    return str(value)


def _shutdown_quietly(nvml: Any, errors: tuple[type[BaseException], ...]) -> None:
    try:
        nvml.nvmlShutdown()
    except errors as exc:
        logger.debug("nvmlShutdown failed: %s", exc)


# ---------------------------------------------------------------------- the scalar path (issue 16)

# Telemetry scalars live in the reserved tag namespace (codec.RESERVED_TAG_PREFIX):
# ``@telemetry/<host>/rank<r>/<field>``. A user's tag cannot start with it (``codec.check_tag``
# refuses it), so the two never clash.


def is_telemetry_tag(tag: str) -> bool:
    """Return whether ``tag`` is in the reserved telemetry namespace."""
    return tag.startswith(RESERVED_TAG_PREFIX)


def scalar_tag(host: str, rank: int, field: str) -> str:
    """The scalar tag of telemetry ``field`` of ``host`` and ``rank``.

    A ``/`` in the host name (never in a real one) becomes ``_``, so that `parse_tag` can split the
    tag again.
    """
    return f"{RESERVED_TAG_PREFIX}{host.replace('/', '_') or '?'}/rank{rank}/{field}"


def parse_tag(tag: str) -> tuple[str, int, str] | None:
    """Split a telemetry tag into ``(host, rank, field)``; None for any other tag."""
    if not tag.startswith(RESERVED_TAG_PREFIX):
        return None
    parts = tag[len(RESERVED_TAG_PREFIX) :].split("/", 2)
    if len(parts) != 3 or not parts[1].startswith("rank") or not parts[2]:
        return None
    try:
        rank = int(parts[1][4:])
    except ValueError:
        return None
    return parts[0], rank, parts[2]


def sample_step(wall: float) -> int:
    """The step of a telemetry point: its wall time in milliseconds.

    Telemetry has no training step; a step that only grows keeps the scalar path's restart rule
    (a step going back supersedes the points from it on) from hiding the samples of a writer that
    resumes a run. Milliseconds keep samples taken 0.1 s apart on distinct steps.
    """
    return int(wall * 1000.0)


def sample_points(sample: dict[str, Any]) -> list[tuple[str, int, float, float]]:
    """One ``(tag, step, value, wall)`` scalar point per field of a `TelemetrySampler` sample."""
    wall = float(sample["wall"])
    step = sample_step(wall)
    host, rank = sample.get("host") or "?", int(sample.get("rank") or 0)
    prefix = scalar_tag(host, rank, "")
    return [(prefix + name, step, float(v), wall) for name, v in sample["fields"].items()]


def _split(scalars: list[ScalarColumns]) -> tuple[list[ScalarColumns], list[ScalarColumns]]:
    """``(other columns, telemetry columns)``, each in batch order."""
    if not any(c.tag.startswith(RESERVED_TAG_PREFIX) for c in scalars):
        return scalars, []
    other = [c for c in scalars if not c.tag.startswith(RESERVED_TAG_PREFIX)]
    return other, [c for c in scalars if c.tag.startswith(RESERVED_TAG_PREFIX)]


def legacy_view(
    scalars: list[ScalarColumns], events: list[dict[str, Any]]
) -> tuple[list[ScalarColumns], list[dict[str, Any]]]:
    """A batch as readers of the event form take it: telemetry columns become ``telemetry``
    events (one per host, rank and wall time, with every field sampled then), the other columns
    stay. A batch without telemetry columns is returned as it is (no copy).

    For the alert detectors (``AlertEngine.observe``) and the run summaries, which tell training
    data (scalars) from telemetry (events) this way.
    """
    other, tele = _split(scalars)
    if not tele:
        return scalars, events
    samples: dict[tuple[str, int, float], dict[str, float]] = {}
    for col in tele:
        parsed = parse_tag(col.tag)
        if parsed is None:
            continue
        host, rank, field = parsed
        for wall, value in zip(col.walls.tolist(), col.values.tolist(), strict=True):
            samples.setdefault((host, rank, wall), {})[field] = value
    made = [
        {
            "kind": "telemetry",
            "tag": None,
            "step": None,
            "wall": wall,
            "host": host,
            "rank": rank,
            "fields": fields,
        }
        for (host, rank, wall), fields in sorted(samples.items(), key=lambda kv: kv[0][2])
    ]
    return other, [*events, *made]


def columns_from_events(events: list[dict[str, Any]]) -> list[ScalarColumns]:
    """Old-format ``telemetry`` events (runs written before issue 16) as telemetry scalar columns,
    one per host, rank and field, in wall-time order: how every reader shows such runs."""
    cols: dict[str, tuple[list[int], list[float], list[float]]] = {}
    for event in events:
        fields, wall = event.get("fields"), event.get("wall")
        if not isinstance(fields, dict) or not isinstance(wall, (int, float)):
            continue
        host = event.get("host") if isinstance(event.get("host"), str) else "?"
        rank = event.get("rank") if type(event.get("rank")) is int else 0
        prefix = scalar_tag(host, rank, "")
        step = sample_step(float(wall))
        for name, value in fields.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                c = cols.setdefault(prefix + name, ([], [], []))
                c[0].append(step)
                c[1].append(float(wall))
                c[2].append(float(value))
    out = []
    for tag, (steps, walls, values) in cols.items():
        order = np.argsort(np.asarray(walls), kind="stable")
        out.append(
            ScalarColumns(
                tag,
                np.asarray(steps, np.int64)[order],
                np.asarray(walls, np.float64)[order],
                np.asarray(values, np.float64)[order],
            )
        )
    return out


def series(columns: list[ScalarColumns]) -> dict[str, dict[str, list[float]]]:
    """Telemetry columns as ``GET /api/telemetry`` answers them: ``{"<host>/rank<r>/<field>":
    {"wall_times": [...], "values": [...]}}`` (a column of any other tag is left out), points of
    one series from several columns merged in wall-time order."""
    merged: dict[str, list[ScalarColumns]] = {}
    for col in columns:
        if col.tag.startswith(RESERVED_TAG_PREFIX) and len(col.walls):
            merged.setdefault(col.tag[len(RESERVED_TAG_PREFIX) :], []).append(col)
    out = {}
    for name, cols in merged.items():
        walls = np.concatenate([c.walls for c in cols])
        values = np.concatenate([c.values for c in cols])
        order = np.argsort(walls, kind="stable")
        out[name] = {"wall_times": walls[order].tolist(), "values": values[order].tolist()}
    return out
