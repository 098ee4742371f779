"""A fake ``pynvml`` module for the telemetry tests: scripted devices, counted calls.

`make_module` builds a fresh module object that mimics the parts of nvidia-ml-py (13.x) that
vdl_stream.telemetry uses: the same function names, argument order, units (mW, KiB/s, bytes) and
exception classes. A test puts it in ``sys.modules["pynvml"]`` and mutates the `FakeDevice` objects
between samples. ``module.calls`` counts calls per ``(function name, device index)``.
"""

from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3


class NVMLError(Exception):
    """Base of the fake NVML errors, like ``pynvml.NVMLError`` (carries ``value``)."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_LIBRARY_NOT_FOUND)


class NVMLError_FunctionNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_FUNCTION_NOT_FOUND)


class NVMLLibraryMismatchError(Exception):
    """Raised by the real module's unversioned process-list calls on an old driver."""


@dataclass
class FakeDevice:
    """One scripted GPU. Values are in NVML's own units (mW, KiB/s, bytes, MHz)."""

    index: int
    name: str = "NVIDIA Fake 80GB"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    util: int = 0
    mem_util: int = 0
    mem_used: int = 0  # allocated, what nvmlMemory_v2 reports as used
    mem_reserved: int = 0  # driver-reserved, included in v1's used
    mem_total: int = 0
    temp: int = 0  # the old nvmlDeviceGetTemperature
    temp_v: int = 0  # nvmlDeviceGetTemperatureV
    power_mw: int = 0
    power_limit_mw: int = 0
    clock_sm: int = 0
    clock_mem: int = 0
    clock_graphics: int = 0
    fan: int = 0
    pcie_kib_s: tuple[int, int] = (0, 0)  # nvmlDeviceGetPcieThroughput (tx, rx), KiB/s
    pcie_count: tuple[int, int] = (0, 0)  # cumulative PCIe bytes (tx, rx), field values 197/198
    pcie_count_return: int = NVML_SUCCESS  # per-field nvmlReturn of the field-value query
    ecc: tuple[int, int] = (0, 0)  # (corrected, uncorrected), volatile
    throttle_ev: int = 0  # nvmlDeviceGetCurrentClocksEventReasons
    throttle_old: int = 0  # nvmlDeviceGetCurrentClocksThrottleReasons
    compute_procs: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    graphics_procs: list[tuple[int, int | None]] = field(default_factory=list)
    # Function name -> exception class that call raises on this device.
    fail: dict[str, type[Exception]] = field(default_factory=dict)


def make_module(
    devices: list[FakeDevice],
    *,
    init_error: type[Exception] | None = None,
    without: tuple[str, ...] = (),
) -> types.ModuleType:
    """Build a fake ``pynvml`` module.

    Args:
        devices: the GPUs, in index order.
        init_error: an exception class ``nvmlInit`` raises (simulates no driver).
        without: attribute names to leave out, to mimic an older nvidia-ml-py (for example
            ``"nvmlDeviceGetTemperatureV"`` or ``"NVML_FI_DEV_PCIE_COUNT_TX_BYTES"``).
    """
    mod = types.ModuleType("pynvml")
    calls: Counter[tuple[str, int | None]] = Counter()
    state = {"initialised": 0}

    def api(fn: Any) -> Any:
        """Count the call, check init, raise the scripted failure for this device."""
        name = fn.__name__

        def wrapper(*args: Any) -> Any:
            handle = args[0] if args and isinstance(args[0], FakeDevice) else None
            calls[(name, handle.index if handle else None)] += 1
            if name not in ("nvmlInit", "nvmlShutdown") and state["initialised"] <= 0:
                raise NVMLError(1)  # NVML_ERROR_UNINITIALIZED
            if handle is not None and name in handle.fail:
                raise handle.fail[name]()
            return fn(*args)

        wrapper.__name__ = name
        setattr(mod, name, wrapper)
        return wrapper

    @api
    def nvmlInit() -> None:
        if init_error is not None:
            raise init_error()
        state["initialised"] += 1

    @api
    def nvmlShutdown() -> None:
        if state["initialised"] <= 0:
            raise NVMLError(1)
        state["initialised"] -= 1

    @api
    def nvmlDeviceGetCount() -> int:
        return len(devices)

    @api
    def nvmlDeviceGetHandleByIndex(index: int) -> FakeDevice:
        if "nvmlDeviceGetHandleByIndex" in devices[index].fail:
            raise devices[index].fail["nvmlDeviceGetHandleByIndex"]()
        return devices[index]

    @api
    def nvmlDeviceGetName(h: FakeDevice) -> str:
        return h.name

    @api
    def nvmlDeviceGetUUID(h: FakeDevice) -> str:
        return h.uuid

    @api
    def nvmlDeviceGetUtilizationRates(h: FakeDevice) -> Any:
        return types.SimpleNamespace(gpu=h.util, memory=h.mem_util)

    @api
    def nvmlDeviceGetMemoryInfo(h: FakeDevice, version: int | None = None) -> Any:
        if version:
            return types.SimpleNamespace(
                version=version,
                total=h.mem_total,
                reserved=h.mem_reserved,
                used=h.mem_used,
                free=h.mem_total - h.mem_used - h.mem_reserved,
            )
        used = h.mem_used + h.mem_reserved
        return types.SimpleNamespace(total=h.mem_total, used=used, free=h.mem_total - used)

    @api
    def nvmlDeviceGetTemperatureV(h: FakeDevice, sensor: int) -> int:
        assert sensor == mod.NVML_TEMPERATURE_GPU
        return h.temp_v

    @api
    def nvmlDeviceGetTemperature(h: FakeDevice, sensor: int) -> int:
        assert sensor == mod.NVML_TEMPERATURE_GPU
        return h.temp

    @api
    def nvmlDeviceGetPowerUsage(h: FakeDevice) -> int:
        return h.power_mw

    @api
    def nvmlDeviceGetEnforcedPowerLimit(h: FakeDevice) -> int:
        return h.power_limit_mw

    @api
    def nvmlDeviceGetClockInfo(h: FakeDevice, clock: int) -> int:
        return {0: h.clock_graphics, 1: h.clock_sm, 2: h.clock_mem}[clock]

    @api
    def nvmlDeviceGetFanSpeed(h: FakeDevice) -> int:
        return h.fan

    @api
    def nvmlDeviceGetPcieThroughput(h: FakeDevice, counter: int) -> int:
        return h.pcie_kib_s[counter]

    @api
    def nvmlDeviceGetFieldValues(h: FakeDevice, field_ids: list[int]) -> list[Any]:
        out = []
        for fid in field_ids:
            number = {197: h.pcie_count[0], 198: h.pcie_count[1]}[fid]
            out.append(
                types.SimpleNamespace(
                    fieldId=fid,
                    scopeId=0,
                    nvmlReturn=h.pcie_count_return,
                    valueType=NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                    value=types.SimpleNamespace(ullVal=number),
                )
            )
        return out

    @api
    def nvmlDeviceGetTotalEccErrors(h: FakeDevice, error_type: int, counter_type: int) -> int:
        assert counter_type == mod.NVML_VOLATILE_ECC
        return h.ecc[error_type]

    @api
    def nvmlDeviceGetCurrentClocksEventReasons(h: FakeDevice) -> int:
        return h.throttle_ev

    @api
    def nvmlDeviceGetCurrentClocksThrottleReasons(h: FakeDevice) -> int:
        return h.throttle_old

    def procs(entries: list[tuple[int, int | None]]) -> list[Any]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in entries]

    @api
    def nvmlDeviceGetComputeRunningProcesses(h: FakeDevice) -> list[Any]:
        return procs(h.compute_procs)

    @api
    def nvmlDeviceGetGraphicsRunningProcesses(h: FakeDevice) -> list[Any]:
        return procs(h.graphics_procs)

    constants = {
        "NVML_SUCCESS": NVML_SUCCESS,
        "NVML_TEMPERATURE_GPU": 0,
        "NVML_CLOCK_GRAPHICS": 0,
        "NVML_CLOCK_SM": 1,
        "NVML_CLOCK_MEM": 2,
        "NVML_PCIE_UTIL_TX_BYTES": 0,
        "NVML_PCIE_UTIL_RX_BYTES": 1,
        "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
        "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
        "NVML_VOLATILE_ECC": 0,
        "NVML_AGGREGATE_ECC": 1,
        "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": 197,
        "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": 198,
        "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
        "nvmlMemory_v2": 0x02000028,
        "NVMLError": NVMLError,
        "NVMLError_NotSupported": NVMLError_NotSupported,
        "NVMLError_LibraryNotFound": NVMLError_LibraryNotFound,
        "NVMLError_FunctionNotFound": NVMLError_FunctionNotFound,
        "NVMLLibraryMismatchError": NVMLLibraryMismatchError,
    }
    for name, value in constants.items():
        setattr(mod, name, value)
    for name in without:
        delattr(mod, name)
    mod.calls = calls
    mod.state = state
    return mod
