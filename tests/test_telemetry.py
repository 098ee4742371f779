"""Tests for vdl_stream.telemetry against a fake pynvml module and scripted psutil counters."""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import psutil
import pytest

from vdl_stream import telemetry
from vdl_stream.telemetry import TelemetrySampler, distributed_env

# Loaded by path so the helper works whatever pytest's import mode or a tests/__init__.py.
_spec = importlib.util.spec_from_file_location(
    "fake_pynvml", Path(__file__).with_name("fake_pynvml.py")
)
fake = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("fake_pynvml", fake)
_spec.loader.exec_module(fake)

ME = os.getpid()
OTHER = ME + 100_000
GIB = 1024**3

GPU_SUFFIXES = {
    "util",
    "mem_util",
    "mem_used",
    "mem_total",
    "temp",
    "power",
    "power_limit",
    "clock_sm",
    "clock_mem",
    "clock_graphics",
    "fan",
    "pcie_tx",
    "pcie_rx",
    "ecc_corrected",
    "ecc_uncorrected",
    "throttle",
    "proc_mem",
}


def full_device() -> fake.FakeDevice:
    """GPU 0: supports everything, PCIe through the byte counters."""
    return fake.FakeDevice(
        index=0,
        name="NVIDIA H200",
        uuid="GPU-aaaa",
        util=87,
        mem_util=41,
        mem_used=30 * GIB,
        mem_reserved=512 * 1024**2,
        mem_total=141 * GIB,
        temp=99,  # must not be used: TemperatureV works here
        temp_v=54,
        power_mw=412_345,
        power_limit_mw=700_000,
        clock_sm=1980,
        clock_mem=2619,
        clock_graphics=1975,
        fan=33,
        pcie_kib_s=(999, 999),  # must not be used: the counters work here
        pcie_count=(10_000_000, 20_000_000),
        ecc=(3, 1),
        throttle_ev=0x4 | 0x40,
        throttle_old=0x1,  # must not be used
        compute_procs=[(OTHER, 5 * GIB), (ME, 2 * GIB)],
        graphics_procs=[(ME, 2 * GIB)],  # same process, both contexts: not double counted
    )


def partial_device() -> fake.FakeDevice:
    """GPU 1: no fan, no ECC, new temperature/throttle calls fail, no PCIe counters."""
    return fake.FakeDevice(
        index=1,
        name="NVIDIA Older",
        uuid="GPU-bbbb",
        util=5,
        mem_util=2,
        mem_used=1 * GIB,
        mem_total=16 * GIB,
        temp=61,
        temp_v=77,
        power_mw=70_500,
        power_limit_mw=250_000,
        clock_sm=1410,
        clock_mem=877,
        clock_graphics=1400,
        pcie_kib_s=(2000, 3000),
        pcie_count_return=fake.NVML_ERROR_NOT_SUPPORTED,
        throttle_old=0x8,
        compute_procs=[(OTHER, 7 * GIB)],
        fail={
            "nvmlDeviceGetFanSpeed": fake.NVMLError_NotSupported,
            "nvmlDeviceGetTotalEccErrors": fake.NVMLError_NotSupported,
            "nvmlDeviceGetTemperatureV": fake.NVMLError_FunctionNotFound,
            "nvmlDeviceGetCurrentClocksEventReasons": fake.NVMLError_FunctionNotFound,
            "nvmlDeviceGetGraphicsRunningProcesses": fake.NVMLError_NotSupported,
        },
    )


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Drive telemetry's interval clock: the sampler reads ``clock[0]``."""
    now = [1000.0]
    monkeypatch.setattr(telemetry, "_clock", lambda: now[0])
    return now


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch):
    mod = fake.make_module([full_device(), partial_device()])
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def gpu_fields(event: dict, index: int) -> dict[str, float]:
    prefix = f"gpu{index}/"
    return {k[len(prefix) :]: v for k, v in event["fields"].items() if k.startswith(prefix)}


def test_event_shape(nvml) -> None:
    s = TelemetrySampler(rank=3)
    before = time.time()
    ev = s.sample()
    after = time.time()
    assert set(ev) == {"kind", "tag", "step", "wall", "host", "rank", "fields"}
    assert ev["kind"] == "telemetry"
    assert ev["tag"] is None and ev["step"] is None
    assert before <= ev["wall"] <= after
    assert ev["host"] == socket.gethostname()
    assert ev["rank"] == 3
    assert all(type(v) is float for v in ev["fields"].values()), ev["fields"]
    assert TelemetrySampler(host="node-7", gpus=False).sample()["host"] == "node-7"
    s.close()


def test_full_device_exact_values(nvml, clock) -> None:
    s = TelemetrySampler()
    first = gpu_fields(s.sample(), 0)
    assert first == {
        "util": 87.0,
        "mem_util": 41.0,
        "mem_used": 30.0 * GIB,  # nvmlMemory_v2: reserved memory not counted, as nvidia-smi
        "mem_total": 141.0 * GIB,
        "temp": 54.0,
        "power": 412.345,
        "power_limit": 700.0,
        "clock_sm": 1980.0,
        "clock_mem": 2619.0,
        "clock_graphics": 1975.0,
        "fan": 33.0,
        "ecc_corrected": 3.0,
        "ecc_uncorrected": 1.0,
        "throttle": float(0x44),
        "proc_mem": 2.0 * GIB,
    }  # PCIe counters need a second read

    dev = nvml.nvmlDeviceGetHandleByIndex(0)
    dev.pcie_count = (10_000_000 + 4_000_000, 20_000_000 + 1_000_000)
    dev.util = 12
    clock[0] += 2.0
    second = gpu_fields(s.sample(), 0)
    assert second["pcie_tx"] == 2_000_000.0
    assert second["pcie_rx"] == 500_000.0
    assert second["util"] == 12.0
    assert set(second) == GPU_SUFFIXES
    assert nvml.calls[("nvmlDeviceGetPcieThroughput", 0)] == 0
    assert nvml.calls[("nvmlDeviceGetTemperature", 0)] == 0
    assert nvml.calls[("nvmlDeviceGetCurrentClocksThrottleReasons", 0)] == 0
    s.close()


def test_partial_device_omits_and_falls_back(nvml, clock) -> None:
    s = TelemetrySampler()
    for _ in range(3):
        got = gpu_fields(s.sample(), 1)
        clock[0] += 1.0
    assert got == {
        "util": 5.0,
        "mem_util": 2.0,
        "mem_used": 1.0 * GIB,
        "mem_total": 16.0 * GIB,
        "temp": 61.0,  # old call, since TemperatureV failed
        "power": 70.5,
        "power_limit": 250.0,
        "clock_sm": 1410.0,
        "clock_mem": 877.0,
        "clock_graphics": 1400.0,
        "pcie_tx": 2000.0 * 1024,  # throughput fallback, KiB/s -> bytes/s
        "pcie_rx": 3000.0 * 1024,
        "throttle": 8.0,  # old throttle-reasons call
        "proc_mem": 0.0,  # compute list answered; this process is not in it
    }
    assert "fan" not in got and "ecc_corrected" not in got and "ecc_uncorrected" not in got


def test_failed_calls_are_not_repeated(nvml, clock) -> None:
    s = TelemetrySampler()
    for _ in range(4):
        s.sample()
        clock[0] += 1.0
    c = nvml.calls
    assert c[("nvmlDeviceGetFanSpeed", 1)] == 1
    assert c[("nvmlDeviceGetTotalEccErrors", 1)] == 2  # corrected and uncorrected, once each
    assert c[("nvmlDeviceGetTemperatureV", 1)] == 1
    assert c[("nvmlDeviceGetTemperature", 1)] == 4
    assert c[("nvmlDeviceGetCurrentClocksEventReasons", 1)] == 1
    assert c[("nvmlDeviceGetCurrentClocksThrottleReasons", 1)] == 4
    assert c[("nvmlDeviceGetFieldValues", 1)] == 1
    assert c[("nvmlDeviceGetPcieThroughput", 1)] == 8
    assert c[("nvmlDeviceGetGraphicsRunningProcesses", 1)] == 1
    # The healthy device keeps being asked.
    assert c[("nvmlDeviceGetFanSpeed", 0)] == 4
    assert c[("nvmlDeviceGetTemperatureV", 0)] == 4


def test_field_that_starts_failing_later_is_dropped(nvml) -> None:
    s = TelemetrySampler()
    assert gpu_fields(s.sample(), 0)["power"] == 412.345
    nvml.nvmlDeviceGetHandleByIndex(0).fail["nvmlDeviceGetPowerUsage"] = fake.NVMLError_NotSupported
    assert "power" not in gpu_fields(s.sample(), 0)
    del nvml.nvmlDeviceGetHandleByIndex(0).fail["nvmlDeviceGetPowerUsage"]
    assert "power" not in gpu_fields(s.sample(), 0)  # not asked again
    assert nvml.calls[("nvmlDeviceGetPowerUsage", 0)] == 2


def test_older_module_without_new_calls(monkeypatch: pytest.MonkeyPatch, clock) -> None:
    mod = fake.make_module(
        [full_device()],
        without=(
            "nvmlDeviceGetTemperatureV",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
            "nvmlMemory_v2",
        ),
    )
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    got = gpu_fields(TelemetrySampler().sample(), 0)
    assert got["temp"] == 99.0
    assert got["throttle"] == 1.0
    assert got["pcie_tx"] == 999.0 * 1024
    assert got["mem_used"] == 30.0 * GIB + 512 * 1024**2  # v1 "used" includes reserved
    assert mod.calls[("nvmlDeviceGetFieldValues", 0)] == 0


def test_temperature_v_returning_struct(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = fake.make_module([full_device()])
    plain = mod.nvmlDeviceGetTemperatureV

    def as_struct(handle, sensor):
        return type("c_nvmlTemperature_v1_t", (), {"temperature": plain(handle, sensor)})()

    mod.nvmlDeviceGetTemperatureV = as_struct
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    assert gpu_fields(TelemetrySampler().sample(), 0)["temp"] == 54.0


def test_proc_mem_matched_by_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = full_device()
    dev.compute_procs = [(OTHER, 5 * GIB)]
    dev.graphics_procs = []
    monkeypatch.setitem(sys.modules, "pynvml", fake.make_module([dev]))
    s = TelemetrySampler()
    assert gpu_fields(s.sample(), 0)["proc_mem"] == 0.0
    dev.compute_procs.append((ME, 6 * GIB))
    assert gpu_fields(s.sample(), 0)["proc_mem"] == 6.0 * GIB
    dev.graphics_procs.append((ME, 6 * GIB))
    assert gpu_fields(s.sample(), 0)["proc_mem"] == 6.0 * GIB  # max of the lists, not 12 GiB


def test_proc_mem_of_the_pid_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = os.getppid()
    dev = full_device()
    dev.compute_procs = [(ME, 1 * GIB), (parent, 3 * GIB)]
    dev.graphics_procs = []
    monkeypatch.setitem(sys.modules, "pynvml", fake.make_module([dev]))
    got = TelemetrySampler(pid=parent).sample()["fields"]
    assert got["gpu0/proc_mem"] == 3.0 * GIB
    assert got["proc/rss"] != float(psutil.Process(ME).memory_info().rss)


def test_proc_mem_unknown_is_omitted(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = full_device()
    dev.compute_procs = [(ME, None)]  # NVML_VALUE_NOT_AVAILABLE, e.g. WDDM
    mod = fake.make_module([dev])
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    got = gpu_fields(TelemetrySampler().sample(), 0)
    assert "proc_mem" not in got
    assert got["util"] == 87.0


def test_proc_mem_omitted_when_both_lists_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = full_device()
    dev.fail["nvmlDeviceGetComputeRunningProcesses"] = fake.NVMLLibraryMismatchError
    dev.fail["nvmlDeviceGetGraphicsRunningProcesses"] = fake.NVMLError_NotSupported
    monkeypatch.setitem(sys.modules, "pynvml", fake.make_module([dev]))
    assert "proc_mem" not in gpu_fields(TelemetrySampler().sample(), 0)


def test_pcie_counter_wrap_skips_one_sample(nvml, clock) -> None:
    s = TelemetrySampler()
    dev = nvml.nvmlDeviceGetHandleByIndex(0)
    s.sample()
    clock[0] += 1.0
    dev.pcie_count = (5, 7)  # went backwards: wrapped or reset
    assert "pcie_tx" not in gpu_fields(s.sample(), 0)
    clock[0] += 0.5
    dev.pcie_count = (1005, 2007)
    got = gpu_fields(s.sample(), 0)
    assert (got["pcie_tx"], got["pcie_rx"]) == (2000.0, 4000.0)


def test_devices(nvml) -> None:
    s = TelemetrySampler()
    assert s.devices() == [
        {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-aaaa", "mem_total": 141.0 * GIB},
        {"index": 1, "name": "NVIDIA Older", "uuid": "GPU-bbbb", "mem_total": 16.0 * GIB},
    ]
    s.devices()[0]["name"] = "changed"
    assert s.devices()[0]["name"] == "NVIDIA H200"  # a copy each time


def test_gpu_without_handle_is_skipped_others_keep_index(monkeypatch, caplog) -> None:
    lost = partial_device()
    lost.index = 0
    lost.fail["nvmlDeviceGetHandleByIndex"] = fake.NVMLError_NotSupported
    good = full_device()
    good.index = 1
    monkeypatch.setitem(sys.modules, "pynvml", fake.make_module([lost, good]))
    caplog.set_level(logging.INFO, logger="vdl_stream.telemetry")
    s = TelemetrySampler()
    ev = s.sample()
    assert [d["index"] for d in s.devices()] == [1]
    assert gpu_fields(ev, 1)["util"] == 87.0
    assert gpu_fields(ev, 0) == {}
    assert [r.getMessage() for r in _no_gpu_log(caplog)] == [
        "GPU telemetry: skipping GPU 0, NVML gives no handle (3)"
    ]


def test_devices_name_unsupported_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = full_device()
    dev.fail["nvmlDeviceGetUUID"] = fake.NVMLError_NotSupported
    monkeypatch.setitem(sys.modules, "pynvml", fake.make_module([dev]))
    assert TelemetrySampler().devices()[0]["uuid"] is None


def test_close_shuts_nvml_down_once(nvml) -> None:
    s = TelemetrySampler()
    assert nvml.state["initialised"] == 1
    s.close()
    s.close()
    assert nvml.state["initialised"] == 0
    assert nvml.calls[("nvmlShutdown", None)] == 1
    with pytest.raises(RuntimeError, match="after close"):
        s.sample()


def test_context_manager_closes(nvml) -> None:
    with TelemetrySampler() as s:
        assert "gpu0/util" in s.sample()["fields"]
    assert nvml.state["initialised"] == 0


def test_gpus_false_skips_nvml(nvml) -> None:
    s = TelemetrySampler(gpus=False)
    ev = s.sample()
    assert not any(k.startswith("gpu") for k in ev["fields"])
    assert s.devices() == []
    s.close()
    assert sum(nvml.calls.values()) == 0


def _no_gpu_log(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "vdl_stream.telemetry"]


def test_no_pynvml_module_logs_once(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    caplog.set_level(logging.DEBUG, logger="vdl_stream.telemetry")
    s = TelemetrySampler()
    events = [s.sample() for _ in range(3)]
    s.close()
    records = _no_gpu_log(caplog)
    assert [(r.levelno, "pynvml" in r.getMessage()) for r in records] == [(logging.INFO, True)]
    assert not any(k.startswith("gpu") for e in events for k in e["fields"])
    assert events[-1]["fields"]["ram/total"] == float(psutil.virtual_memory().total)
    assert "proc/rss" in events[-1]["fields"]


def test_nvml_init_failure_logs_once(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    mod = fake.make_module([full_device()], init_error=fake.NVMLError_LibraryNotFound)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    caplog.set_level(logging.DEBUG, logger="vdl_stream.telemetry")
    s = TelemetrySampler()
    for _ in range(3):
        assert not any(k.startswith("gpu") for k in s.sample()["fields"])
    s.close()
    records = _no_gpu_log(caplog)
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert "NVML is not available" in records[0].getMessage()
    assert mod.calls[("nvmlShutdown", None)] == 0  # never initialised, never shut down
    assert mod.calls[("nvmlDeviceGetCount", None)] == 0


def test_zero_gpus_logs_once(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake.make_module([]))
    caplog.set_level(logging.INFO, logger="vdl_stream.telemetry")
    s = TelemetrySampler()
    s.sample()
    s.sample()
    assert [r.getMessage() for r in _no_gpu_log(caplog)] == ["GPU telemetry off: NVML found no GPU"]


# ---------------------------------------------------------------------------- host fields

CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait guest guest_nice")
Disk = namedtuple("Disk", "read_bytes write_bytes")
Net = namedtuple("Net", "bytes_sent bytes_recv")


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Scripted psutil counters: tests set ``host["cpu"]``, ``host["disk"]``, ``host["net"]``."""
    now = {
        "cpu": CpuTimes(100.0, 0.0, 50.0, 800.0, 50.0, 0.0, 0.0),
        "disk": Disk(1_000, 2_000),
        "net": Net(10_000, 20_000),
    }
    monkeypatch.setattr(psutil, "cpu_times", lambda: now["cpu"])
    monkeypatch.setattr(psutil, "disk_io_counters", lambda: now["disk"])
    monkeypatch.setattr(psutil, "net_io_counters", lambda: now["net"])
    return now


RATE_FIELDS = {
    "disk/read_bytes_per_s",
    "disk/write_bytes_per_s",
    "net/sent_bytes_per_s",
    "net/recv_bytes_per_s",
}


def test_rates_omitted_first_then_exact(host, clock) -> None:
    s = TelemetrySampler(gpus=False)
    first = s.sample()["fields"]
    assert not RATE_FIELDS & set(first)
    assert "cpu/percent" not in first and "proc/cpu_percent" not in first
    assert first["proc/rss"] > 0

    clock[0] += 0.5
    host["disk"] = Disk(1_000 + 500_000, 2_000 + 50)
    host["net"] = Net(10_000 + 1_000, 20_000)
    # 10 s more of CPU time, 3 s of it busy (user 2 + system 1), idle+iowait 7; guest in user.
    host["cpu"] = CpuTimes(102.0, 0.0, 51.0, 805.0, 52.0, 1.0, 0.0)
    second = s.sample()["fields"]
    assert second["disk/read_bytes_per_s"] == 1_000_000.0
    assert second["disk/write_bytes_per_s"] == 100.0
    assert second["net/sent_bytes_per_s"] == 2_000.0
    assert second["net/recv_bytes_per_s"] == 0.0
    assert second["cpu/percent"] == pytest.approx(30.0)
    assert second["proc/cpu_percent"] >= 0.0


def test_counter_reset_and_missing_counters(host, clock) -> None:
    s = TelemetrySampler(gpus=False)
    s.sample()
    clock[0] += 1.0
    host["disk"] = Disk(0, 5_000)  # read counter reset (e.g. a disk went away)
    host["net"] = None  # psutil returns None without network interfaces
    got = s.sample()["fields"]
    assert "disk/read_bytes_per_s" not in got
    assert got["disk/write_bytes_per_s"] == 3_000.0
    assert "net/sent_bytes_per_s" not in got and "net/recv_bytes_per_s" not in got


def test_no_time_elapsed_gives_no_rate(host, clock) -> None:
    s = TelemetrySampler(gpus=False)
    s.sample()
    host["disk"] = Disk(9_000, 9_000)
    assert "disk/read_bytes_per_s" not in s.sample()["fields"]


def test_real_psutil_fields_plausible() -> None:
    s = TelemetrySampler(gpus=False)
    s.sample()
    time.sleep(0.05)
    f = s.sample()["fields"]
    assert 0.0 <= f["cpu/percent"] <= 100.0
    assert 0.0 < f["ram/used"] <= f["ram/total"]
    assert 0.0 <= f["ram/percent"] <= 100.0
    assert 0.0 < f["proc/rss"] < f["ram/total"]
    assert f["proc/cpu_percent"] >= 0.0
    assert f["net/sent_bytes_per_s"] >= 0.0


def test_process_gone_drops_proc_fields() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        s = TelemetrySampler(gpus=False, pid=child.pid)
        assert s.sample()["fields"]["proc/rss"] > 0
    finally:
        child.kill()
        child.wait(timeout=10)
    got = s.sample()["fields"]
    assert "proc/rss" not in got and "proc/cpu_percent" not in got
    assert "ram/total" in got
    assert "proc/rss" not in s.sample()["fields"]


# ---------------------------------------------------------------------------- arguments, env


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        ({"rank": -1}, ValueError, "rank must be >= 0, got -1"),
        ({"rank": "0"}, TypeError, "rank must be an int, got '0'"),
        ({"rank": True}, TypeError, "rank must be an int, got True"),
        ({"host": ""}, ValueError, "host must be a non-empty str, got ''"),
        ({"host": 3}, TypeError, "host must be a str or None, got 3"),
        ({"gpus": 1}, TypeError, "gpus must be a bool, got 1"),
        ({"pid": 0}, ValueError, "pid must be > 0, got 0"),
        ({"pid": 2**22 + 12345}, ValueError, "pid must be a running process, got 4206649"),
    ],
)
def test_bad_arguments(kwargs, exc, message) -> None:
    kwargs = {"gpus": False, **kwargs}
    with pytest.raises(exc) as info:
        TelemetrySampler(**kwargs)
    assert str(info.value) == message


DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (0, 0, 1)),
        ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}, (3, 1, 8)),
        ({"PADDLE_TRAINER_ID": "2", "PADDLE_TRAINERS_NUM": "4"}, (2, 0, 4)),
        ({"RANK": "5", "PADDLE_TRAINER_ID": "2", "WORLD_SIZE": "6"}, (5, 0, 6)),
        ({"RANK": "", "PADDLE_TRAINER_ID": " 7 "}, (7, 0, 1)),
    ],
)
def test_distributed_env(monkeypatch: pytest.MonkeyPatch, env, expected) -> None:
    for name in DIST_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert distributed_env() == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "zero"}, "environment variable RANK must be an integer, got 'zero'"),
        ({"WORLD_SIZE": "0"}, "environment variable WORLD_SIZE must be >= 1, got '0'"),
        ({"LOCAL_RANK": "-1"}, "environment variable LOCAL_RANK must be >= 0, got '-1'"),
    ],
)
def test_distributed_env_bad(monkeypatch: pytest.MonkeyPatch, env, message) -> None:
    for name in DIST_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as info:
        distributed_env()
    assert str(info.value) == message


# -- telemetry on the scalar path (issue 16) ---------------------------------------------------------


def test_sample_points_are_one_scalar_per_field_under_the_reserved_tags() -> None:
    sample = {"kind": "telemetry", "wall": 1.7e9 + 0.25, "host": "n1", "rank": 2,
              "fields": {"gpu0/util": 87, "ram/used": 1.5e9}}  # fmt: skip
    points = telemetry.sample_points(sample)
    assert points == [
        ("@telemetry/n1/rank2/gpu0/util", 1_700_000_000_250, 87.0, 1.7e9 + 0.25),
        ("@telemetry/n1/rank2/ram/used", 1_700_000_000_250, 1.5e9, 1.7e9 + 0.25),
    ]
    for tag, *_ in points:
        assert telemetry.is_telemetry_tag(tag)
    assert telemetry.parse_tag(points[0][0]) == ("n1", 2, "gpu0/util")
    assert telemetry.parse_tag("@telemetry/a/rank0/") is None
    assert telemetry.parse_tag("@telemetry/a/r0/x") is None
    assert telemetry.parse_tag("train/loss") is None
    assert telemetry.scalar_tag("a/b", 0, "cpu/percent") == "@telemetry/a_b/rank0/cpu/percent"


def test_user_tags_cannot_enter_the_telemetry_namespace(tmp_path) -> None:
    from vdl_stream import attach, codec

    with attach(tmp_path, run="r", telemetry=False) as w:
        with pytest.raises(ValueError, match="reserved for telemetry"):
            w.add_scalar("@telemetry/n1/rank0/gpu0/util", 1.0, 0)
        with pytest.raises(ValueError, match="reserved for telemetry"):
            w.add_scalars("@telemetry", {"x": 1.0}, 0)
        with pytest.raises(ValueError, match="reserved for telemetry"):
            w.add_text("@telemetry/notes", "x", 0)
        w.add_scalar("telemetry/mine", 1.0, 0)  # only the "@" prefix is reserved
    # the wire takes them in scalar columns: the writer's sampler sends them that way
    frame = codec.encode_batch(
        codec.Batch("w", 1, "r", telemetry.columns_from_events([_old_event(1.7e9, 50.0)]))
    )
    batch = codec.decode_batch(codec.decode_message(frame))
    assert [c.tag for c in batch.scalars] == [
        "@telemetry/n1/rank0/gpu0/util",
        "@telemetry/n1/rank0/ram/used",
    ]


def _old_event(wall: float, util: float, rank: int = 0) -> dict:
    return {"kind": "telemetry", "tag": None, "step": None, "wall": wall, "host": "n1",
            "rank": rank, "fields": {"gpu0/util": util, "ram/used": 2e9}}  # fmt: skip


def test_legacy_view_and_old_events_convert_both_ways() -> None:
    from vdl_stream.codec import ScalarColumns

    old = [_old_event(1.7e9 + 1, 60.0), _old_event(1.7e9, 50.0), _old_event(1.7e9, 5.0, rank=1)]
    cols = telemetry.columns_from_events(old)
    by_tag = {c.tag: c for c in cols}
    util = by_tag["@telemetry/n1/rank0/gpu0/util"]
    assert util.walls.tolist() == [1.7e9, 1.7e9 + 1] and util.values.tolist() == [50.0, 60.0]
    assert util.steps.tolist() == [1_700_000_000_000, 1_700_000_001_000]
    assert by_tag["@telemetry/n1/rank1/gpu0/util"].values.tolist() == [5.0]
    loss = ScalarColumns("loss", np.array([1]), np.array([1.7e9]), np.array([0.5]))
    other, events = telemetry.legacy_view([loss, *cols], [{"kind": "meta", "wall": 1.7e9}])
    assert other == [loss]
    assert events[0]["kind"] == "meta"
    made = sorted(events[1:], key=lambda e: (e["wall"], e["rank"]))
    assert [(e["wall"], e["rank"], e["fields"]["gpu0/util"]) for e in made] == [
        (1.7e9, 0, 50.0), (1.7e9, 1, 5.0), (1.7e9 + 1, 0, 60.0)
    ]  # fmt: skip
    assert all(e["kind"] == "telemetry" and e["host"] == "n1" for e in made)
    same = ([loss], [])
    assert telemetry.legacy_view(*same)[0] is same[0]  # nothing to convert: no copy
    series = telemetry.series([*cols, loss])
    assert sorted(series) == [
        "n1/rank0/gpu0/util", "n1/rank0/ram/used", "n1/rank1/gpu0/util", "n1/rank1/ram/used"
    ]  # fmt: skip
    assert series["n1/rank0/gpu0/util"] == {
        "wall_times": [1.7e9, 1.7e9 + 1],
        "values": [50.0, 60.0],
    }


async def _live_frames(ws_url: str, run: str, done, seconds: float) -> list[dict]:
    """Subscribe to ``run`` on /ws/live; collect snapshot and data frames until ``done(frames)``."""
    import msgpack
    import trio
    from trio_websocket import open_websocket_url

    frames: list[dict] = []
    async with open_websocket_url(ws_url + "/ws/live") as ws:
        await ws.send_message(msgpack.packb({"type": "subscribe", "runs": [run]}))
        with trio.fail_after(seconds):
            while not done(frames):
                message = msgpack.unpackb(await ws.get_message(), raw=False)
                if message.get("type") in ("snapshot", "data") and message.get("run") == run:
                    frames.append(message)
    return frames


def _telemetry_tags(frames: list[dict]) -> set[str]:
    return {c[0] for f in frames for c in f["scalars"] if c[0].startswith("@telemetry/")}


async def test_a_new_runs_telemetry_arrives_as_scalars(nursery, tmp_path, monkeypatch) -> None:
    import csv
    import io
    from functools import partial

    import trio

    from tests.conftest import http_get, http_request
    from vdl_stream import attach
    from vdl_stream.server import run_server

    device = fake.FakeDevice(0, util=87, mem_used=3 << 30, mem_total=80 << 30)
    monkeypatch.setitem(sys.modules, "pynvml", fake.make_module([device]))
    url = await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0))
    ws_url = "ws" + url[len("http") :]
    host = socket.gethostname()
    util_tag = f"@telemetry/{host}/rank0/gpu0/util"
    writer = await trio.to_thread.run_sync(
        partial(attach, url=ws_url, run="new", telemetry_interval=0.1)
    )
    try:
        writer.add_scalar("loss", 0.5, 0)
        frames = await _live_frames(ws_url, "new", lambda f: util_tag in _telemetry_tags(f), 30)
    finally:
        await trio.to_thread.run_sync(writer.close)
    values = [
        v
        for f in frames
        for tag, _steps, _walls, col in f["scalars"]
        if tag == util_tag
        for v in np.frombuffer(col, "<f8").tolist()
    ]
    assert values and set(values) == {87.0}
    assert not [e for f in frames for e in f["events"] if e.get("kind") == "telemetry"]
    with trio.fail_after(20):
        status, body = await trio.to_thread.run_sync(http_get, url + "/api/telemetry?run=new")
        assert status == 200 and set(body["series"][f"{host}/rank0/gpu0/util"]["values"]) == {87.0}
        status, runs = await trio.to_thread.run_sync(http_get, url + "/api/runs")
        [summary] = runs["runs"]
        assert list(summary["last"]) == ["loss"] and summary["last_step"] == 0  # not telemetry's
        assert summary["host"] == host
        status, _, body = await trio.to_thread.run_sync(
            http_request, url + "/api/export?run=new&format=csv"
        )
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    mine = [r for r in rows if r["tag"] == f"telemetry/{host}/rank0/gpu0/util"]
    assert mine and {float(r["value"]) for r in mine} == {87.0} and mine[0]["step"] == ""
    assert not [r for r in rows if r["tag"].startswith("@")]


async def test_an_old_format_runs_telemetry_still_shows(nursery, tmp_path) -> None:
    import json
    from functools import partial

    import trio

    import recorder
    from tests.conftest import http_get, http_request
    from vdl_stream.server import run_server

    with recorder.RunWriter(tmp_path / "old") as w:  # as runs written before issue 16 hold it
        for i in range(5):
            e = _old_event(1.7e9 + i, 40.0 + i)
            w.append_record(
                "telemetry", None, None, e["wall"], {k: e[k] for k in ("host", "rank", "fields")}
            )
    url = await nursery.start(partial(run_server, tmp_path, "127.0.0.1", 0))
    ws_url = "ws" + url[len("http") :]
    # the page gets the events (store.js reads each as points of its @telemetry/ series)
    frames = await _live_frames(ws_url, "old", lambda f: bool(f), 20)
    events = [e for e in frames[0]["events"] if e["kind"] == "telemetry"]
    assert [e["fields"]["gpu0/util"] for e in events] == [40.0, 41.0, 42.0, 43.0, 44.0]
    with trio.fail_after(20):
        status, body = await trio.to_thread.run_sync(http_get, url + "/api/telemetry?run=old")
        assert status == 200
        assert body["series"]["n1/rank0/gpu0/util"] == {
            "wall_times": [1.7e9 + i for i in range(5)], "values": [40.0 + i for i in range(5)]
        }  # fmt: skip
        status, _, raw = await trio.to_thread.run_sync(
            http_request, url + "/api/export?run=old&format=json"
        )
    exported = json.loads(raw)
    assert exported["telemetry/n1/rank0/gpu0/util"] == [
        [1.7e9 + i, None, 40.0 + i] for i in range(5)
    ]
