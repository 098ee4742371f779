"""Check vdl_stream.telemetry on a real NVIDIA machine, once, and print a compact report.

Run from the repository root (no install needed):

    pip install nvidia-ml-py psutil     # if missing; numpy/msgpack are not needed by this script
    python bench/gpu_check.py

It samples 5 times at 0.2 s intervals (under a small matmul load on GPU 0 when torch with CUDA is
importable), compares a few fields with ``nvidia-smi --query-gpu``, times each sample and each NVML
call the sampler makes, and prints which fields each GPU reported. It never runs longer than
120 s: a watchdog ends the process with exit status 124. Exit status 0 means the report was printed
(read it: mismatches are reported, not fatal); 2 means an import failed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

LIMIT_S = 120.0
T0 = time.monotonic()
ROOT = Path(__file__).resolve().parents[1]

GPU_FIELDS = [
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
]
HOST_FIELDS = [
    "cpu/percent",
    "ram/used",
    "ram/total",
    "ram/percent",
    "proc/rss",
    "proc/cpu_percent",
    "disk/read_bytes_per_s",
    "disk/write_bytes_per_s",
    "net/sent_bytes_per_s",
    "net/recv_bytes_per_s",
]
# nvidia-smi query name -> (telemetry field, scale from the field to nvidia-smi's unit, tolerance)
SMI = {
    "utilization.gpu": ("util", 1.0, 25.0),
    "memory.used": ("mem_used", 1 / 2**20, 64.0),
    "memory.total": ("mem_total", 1 / 2**20, 1.0),
    "temperature.gpu": ("temp", 1.0, 3.0),
    "power.draw": ("power", 1.0, 60.0),
    "clocks.sm": ("clock_sm", 1.0, 200.0),
}


def elapsed() -> float:
    return time.monotonic() - T0


def say(*parts: object) -> None:
    print(*parts, flush=True)


def watchdog() -> None:
    say(f"TIMEOUT: gpu_check.py ran past {LIMIT_S:.0f} s; stopping (exit 124)")
    os._exit(124)


def import_telemetry():
    """Import vdl_stream.telemetry; fall back to loading the file alone if the package won't."""
    sys.path.insert(0, str(ROOT))
    missing = []
    for name in ("psutil", "pynvml"):
        try:
            __import__(name)
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
    if missing:
        say("IMPORT FAILED:", "; ".join(missing))
        say("  fix: pip install nvidia-ml-py psutil   (never the deprecated 'pynvml' package)")
        sys.exit(2)
    try:
        from vdl_stream import telemetry

        return telemetry
    except ImportError as exc:
        say(f"note: `import vdl_stream.telemetry` failed ({exc}); loading telemetry.py by path")
    path = ROOT / "vdl_stream" / "telemetry.py"
    spec = importlib.util.spec_from_file_location("vdl_stream_telemetry", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        say(f"IMPORT FAILED: {path}: {exc!r}")
        sys.exit(2)
    return module


def start_load(stop: threading.Event) -> str:
    """Matmuls on cuda:0 in a thread until ``stop``; returns what was started (or why not)."""
    if os.environ.get("GPU_CHECK_NO_LOAD"):
        return "skipped (GPU_CHECK_NO_LOAD set)"
    try:
        import torch
    except Exception as exc:
        return f"skipped (torch not importable: {exc.__class__.__name__})"
    if not torch.cuda.is_available():
        return "skipped (torch has no CUDA device)"
    ready = threading.Event()
    info: dict[str, str] = {}

    def work() -> None:
        try:
            a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
            b = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
            torch.cuda.synchronize()
            ready.set()
            while not stop.is_set():
                for _ in range(20):
                    c = a @ b
                torch.cuda.synchronize()
            del c
        except Exception as exc:
            info["error"] = repr(exc)
            ready.set()

    threading.Thread(target=work, name="gpu-load", daemon=True).start()
    if not ready.wait(timeout=45):
        return "started, but not ready within 45 s"
    if "error" in info:
        return f"failed: {info['error']}"
    time.sleep(1.5)  # NVML utilization averages over up to 1 s
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    return f"bf16 8192^2 matmuls on cuda:0 (CUDA_VISIBLE_DEVICES={visible})"


def nvidia_smi() -> tuple[list[dict[str, float | None]], str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], "nvidia-smi not found"
    query = list(SMI)
    cmd = [exe, f"--query-gpu={','.join(query)}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=15, check=False)
    except subprocess.TimeoutExpired:
        return [], "nvidia-smi timed out after 15 s"
    if out.returncode != 0:
        return [], f"nvidia-smi exit {out.returncode}: {out.stderr.strip()[:200]}"
    rows = []
    for line in out.stdout.strip().splitlines():
        row: dict[str, float | None] = {}
        for name, cell in zip(query, line.split(","), strict=False):
            try:
                row[name] = float(cell.strip())
            except ValueError:
                row[name] = None  # "[N/A]", "[Not Supported]"
        rows.append(row)
    return rows, "ok"


def time_nvml_calls(sampler) -> dict[str, float]:
    """Milliseconds of one call of each NVML function the sampler uses, on GPU 0."""
    import pynvml as n

    gpus = getattr(sampler, "_gpus", [])
    if not gpus:
        return {}
    h = gpus[0].handle
    calls = {
        "UtilizationRates": lambda: n.nvmlDeviceGetUtilizationRates(h),
        "MemoryInfo_v2": lambda: n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2),
        "TemperatureV": lambda: n.nvmlDeviceGetTemperatureV(h, n.NVML_TEMPERATURE_GPU),
        "Temperature(old)": lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
        "PowerUsage": lambda: n.nvmlDeviceGetPowerUsage(h),
        "EnforcedPowerLimit": lambda: n.nvmlDeviceGetEnforcedPowerLimit(h),
        "ClockInfo(SM)": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
        "FanSpeed": lambda: n.nvmlDeviceGetFanSpeed(h),
        "FieldValues(PCIe bytes)": lambda: n.nvmlDeviceGetFieldValues(
            h, [n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, n.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
        ),
        "PcieThroughput(TX)": lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES),
        "TotalEccErrors": lambda: n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC
        ),
        "ClocksEventReasons": lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h),
        "ComputeRunningProcesses": lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
        "GraphicsRunningProcesses": lambda: n.nvmlDeviceGetGraphicsRunningProcesses(h),
    }
    result = {}
    for name, fn in calls.items():
        t = time.perf_counter()
        try:
            fn()
            result[name] = round((time.perf_counter() - t) * 1e3, 3)
        except Exception as exc:
            result[name] = f"error: {exc.__class__.__name__}: {exc}"
    return result


def main() -> int:
    timer = threading.Timer(LIMIT_S, watchdog)
    timer.daemon = True
    timer.start()

    telemetry = import_telemetry()
    import psutil
    import pynvml

    say("== vdl-stream gpu_check")
    say(
        f"python {sys.version.split()[0]}  psutil {psutil.__version__}  pynvml from {getattr(pynvml, '__file__', '?')}"
    )
    try:
        from importlib.metadata import version

        say(f"nvidia-ml-py {version('nvidia-ml-py')}")
    except Exception as exc:
        say(f"nvidia-ml-py version unknown ({exc!r})")
    say(
        f"has TemperatureV={hasattr(pynvml, 'nvmlDeviceGetTemperatureV')} "
        f"ClocksEventReasons={hasattr(pynvml, 'nvmlDeviceGetCurrentClocksEventReasons')} "
        f"PCIe byte counters={hasattr(pynvml, 'NVML_FI_DEV_PCIE_COUNT_TX_BYTES')}"
    )

    import logging

    logging.basicConfig(level=logging.WARNING, format="  log %(levelname)s %(name)s: %(message)s")
    logging.getLogger("vdl_stream.telemetry").setLevel(logging.DEBUG)
    t = time.perf_counter()
    sampler = telemetry.TelemetrySampler(rank=0)
    say(f"init: {(time.perf_counter() - t) * 1e3:.1f} ms")
    try:
        say(f"driver {pynvml.nvmlSystemGetDriverVersion()}")
    except Exception as exc:
        say(f"driver version unknown ({exc!r})")
    for d in sampler.devices():
        say(f"device {json.dumps(d)}")

    stop = threading.Event()
    load = start_load(stop) if elapsed() < 50 else "skipped (out of time)"
    say(f"load: {load}")

    events, costs = [], []
    for i in range(5):
        t = time.perf_counter()
        events.append(sampler.sample())
        costs.append((time.perf_counter() - t) * 1e3)
        if i < 4:
            time.sleep(0.2)
    smi_rows, smi_status = nvidia_smi()
    stop.set()

    say(
        f"sample() cost ms: {' '.join(f'{c:.2f}' for c in costs)} "
        f"(first includes baselines; median {sorted(costs)[2]:.2f})"
    )
    last = events[-1]["fields"]
    say(f"event keys: {sorted(events[-1])}  host={events[-1]['host']} rank={events[-1]['rank']}")

    mismatches = []
    n_gpus = len(sampler.devices())
    for i in range(n_gpus):
        p = f"gpu{i}/"
        present = {f: last[p + f] for f in GPU_FIELDS if p + f in last}
        missing = [f for f in GPU_FIELDS if p + f not in last]
        off = sorted(sampler._gpus[i].off) if i < len(sampler._gpus) else []
        say(
            f"-- gpu{i}: {len(present)}/{len(GPU_FIELDS)} fields; missing: {missing or 'none'}; "
            f"calls disabled: {off or 'none'}"
        )
        say("   " + "  ".join(f"{k}={_fmt(v)}" for k, v in present.items()))
        if i < len(smi_rows):
            row = smi_rows[i]
            parts = []
            for q, (f, scale, tol) in SMI.items():
                ours = present.get(f)
                theirs = row.get(q)
                ours_s = None if ours is None else round(ours * scale, 1)
                flag = ""
                if ours_s is not None and theirs is not None and abs(ours_s - theirs) > tol:
                    flag = " MISMATCH"
                    mismatches.append(f"gpu{i} {q}: ours {ours_s} vs nvidia-smi {theirs}")
                parts.append(f"{q} ours={ours_s} smi={theirs}{flag}")
            say("   vs nvidia-smi: " + "; ".join(parts))
    say(f"nvidia-smi: {smi_status}")
    if n_gpus:
        import pynvml as n

        h = sampler._gpus[0].handle
        try:
            v1 = n.nvmlDeviceGetMemoryInfo(h)
            v2 = n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2)
            say(
                f"gpu0 memory used: v1 {v1.used / 2**20:.0f} MiB, v2 {v2.used / 2**20:.0f} MiB "
                f"(reserved {v2.reserved / 2**20:.0f} MiB)"
            )
        except Exception as exc:
            say(f"gpu0 memory v1/v2 compare failed: {exc!r}")
        say(f"gpu0 NVML call cost ms: {json.dumps(time_nvml_calls(sampler))}")
    host_present = [f for f in HOST_FIELDS if f in last]
    say(
        f"host fields: {len(host_present)}/{len(HOST_FIELDS)}; missing: "
        f"{[f for f in HOST_FIELDS if f not in last] or 'none'}"
    )
    say("   " + "  ".join(f"{f}={_fmt(last[f])}" for f in host_present))
    say(f"mismatches: {mismatches or 'none'}")
    sampler.close()
    say(f"done in {elapsed():.1f} s")
    timer.cancel()
    return 0


def _fmt(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v:.4g}"
    return f"{v:g}"


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit:
        raise
    except BaseException as exc:
        import traceback

        traceback.print_exc()
        say(f"FAILED: {exc!r}")
        code = 1
    sys.stdout.flush()
    os._exit(code)  # do not wait on the load thread or CUDA teardown
