"""A training process for the live alert tests: ``python tests/alert_writer.py URL RUN FAULT [STEPS]``.

Runs the demo's training (tests/alert_faults.py) against a ``vdl-stream serve`` at ``URL`` with one
fault: ``lr`` (x100 from step 300), ``nan`` (a NaN loss at step 300), ``grad`` (gradients x1e6 from
step 300), ``pause`` (stops logging at step 300 until killed), ``kill`` (logs, flushes, prints
``ready`` and waits to be SIGKILLed), ``gpu`` (a fake NVML GPU at 10% utilisation; trains slowly
while telemetry samples arrive), ``none``. Prints ``ready`` once the first points are flushed.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import alert_faults


def main() -> None:
    url, run, fault = sys.argv[1:4]
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 600
    if fault == "gpu":
        from tests import fake_pynvml

        gpu = fake_pynvml.FakeDevice(0, util=10, mem_total=80 << 30, mem_used=8 << 30)
        sys.modules["pynvml"] = fake_pynvml.make_module([gpu])
    from vdl_stream import attach

    writer = attach(url=url, run=run, telemetry=fault == "gpu", telemetry_interval=0.2)
    first = threading.Event()

    def on_step(step: int, wall: float) -> None:
        if step == 50:
            writer.flush()
            print("ready", flush=True)
            first.set()

    kwargs: dict = {}
    if fault == "lr":
        kwargs["lr_boost_at"] = 300
    elif fault == "nan":
        kwargs["nan_at"] = 300
    elif fault == "grad":
        kwargs["grad_scale_at"] = 300
    elif fault in ("pause", "kill"):
        kwargs["pause_at"] = 300
        kwargs["pause"] = lambda: (writer.flush(), print("paused", flush=True), time.sleep(3600))
    delay = 0.05 if fault == "gpu" else 0.002
    alert_faults.train(writer, steps, on_step=on_step, delay=delay, **kwargs)
    writer.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
