"""The page's live subscription in headless Chromium against a real ``vdl-stream serve``:
narrowing and widening the runs drawn re-subscribes with ``keep`` (the runs the page holds are not
sent again), snapshots come split (charts first, events after) and live frames batched, and a run
written the whole time ends up with every point once (docs/protocol.md)."""

from __future__ import annotations

import threading

from tests.conftest import start_serve, stop_serve
from vdl_stream import attach

READY = "() => window.vdl && window.vdl.sync.phase === 'ready'"
FINISHED = ["a-adam", "b-sgd", "c-adam", "d-sgd"]
STEPS = 30

# Per run: the generation of its series (bumped each time a snapshot replaces it), or null.
GENERATIONS_JS = """() => Object.fromEntries([...window.vdl.store.runs.values()].map(r =>
  [r.name, r.scalars.get('eval/accuracy') ? r.scalars.get('eval/accuracy').generation : null]))"""


def test_changing_the_runs_drawn_sends_only_the_added_runs(tmp_path, browser):
    server = start_serve(tmp_path / "logs")
    stop = threading.Event()
    sent = [0]
    page = None
    try:
        for i, name in enumerate(FINISHED):
            with attach(url=server.ws_url, run=name, telemetry=False) as writer:
                writer.add_hparams({"lr": 0.1 * (i + 1)}, ["eval/accuracy"])
                for step in range(STEPS):
                    writer.add_scalar("eval/accuracy", i + step / 64, step)
        live = attach(url=server.ws_url, run="e-adam-live", telemetry=False)

        def write() -> None:
            while not stop.is_set() and sent[0] < 100_000:
                live.add_scalar("eval/accuracy", sent[0] / 1000, sent[0])
                sent[0] += 1
                if sent[0] % 20 == 0:
                    live.flush(10)
                    stop.wait(0.01)

        thread = threading.Thread(target=write, daemon=True)
        thread.start()
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server.url + "/")
        page.wait_for_function(READY, timeout=30_000)
        page.wait_for_function(
            "() => window.vdl.store.runs.size === 5 && [...window.vdl.store.runs.values()]"
            ".every(r => r.scalars.size === 1 && r.hparams !== null || r.name.includes('live'))",
            timeout=30_000,
        )
        before = page.evaluate(GENERATIONS_JS)
        # Narrow to the adam runs: the sgd runs are dropped, the adam runs stay as they are.
        page.fill("input.run-search", "adam")
        page.wait_for_function(
            "() => (window.vdl.connection.runs || []).length === 3 && window.vdl.sync.phase === 'ready'",
            timeout=30_000,
        )
        page.wait_for_function(
            "() => !window.vdl.store.series('b-sgd', 'eval/accuracy')", timeout=10_000
        )
        # Widen again: only the two sgd runs come back as snapshots.
        page.fill("input.run-search", "")
        page.wait_for_function(
            "() => window.vdl.connection.runs === null || window.vdl.connection.runs.length === 5",
            timeout=30_000,
        )
        page.wait_for_function(
            "() => window.vdl.sync.phase === 'ready' && ['b-sgd', 'd-sgd'].every(r =>"
            " (window.vdl.store.series(r, 'eval/accuracy') || {length: 0}).length === 30)"
            " && window.vdl.store.runs.get('b-sgd').hparams !== null",
            timeout=30_000,
        )
        after = page.evaluate(GENERATIONS_JS)
        for name in ("a-adam", "c-adam", "e-adam-live"):
            assert after[name] == before[name], (name, before, after)  # kept: not sent again
        # The live run, written the whole time, holds every point once.
        stop.set()
        thread.join(30)
        assert live.flush(30)
        live.close()
        total = sent[0]
        page.wait_for_function(
            f"() => window.vdl.series('e-adam-live', 'eval/accuracy').steps.length === {total}",
            timeout=30_000,
        )
        steps = page.evaluate("() => window.vdl.series('e-adam-live', 'eval/accuracy').steps")
        assert steps == list(range(total))
        stats = page.evaluate("() => window.vdl.connection.stats")
        assert stats["badFrames"] == 0 and stats["gaps"] == 0
        # Live frames come batched only past 200 messages a second (this run sends fewer: each
        # goes at once; tests/test_live_subscribe.py checks the batching): never split.
        assert stats["messages"] <= stats["frames"]
        assert errors == []
    finally:
        stop.set()
        if page is not None:
            page.close()
        stop_serve(server)
