"""Live alerts (issue 14): the alert event, the detectors on real demo runs with injected faults,
rules files, rate limits, the live path (a real server, a real writer process, a WebSocket client)
and the webhooks."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from trio_websocket import open_websocket_url

import recorder
from tests import alert_faults
from tests.conftest import http_get, start_serve, stop_serve
from vdl_stream import attach, codec
from vdl_stream.alerts import (
    AlertEngine,
    RulesError,
    alert_event,
    load_rules,
    rules_from_dict,
)

ROOT = Path(__file__).resolve().parents[1]


# -- the alert event -------------------------------------------------------------------------


def test_an_alert_event_passes_the_codec_and_bad_ones_are_refused():
    event = alert_event("Loss exploded", "loss is 1e9", "error", step=3, rule="user")
    assert codec.check_event(dict(event)) == event
    assert event["kind"] == "alert" and event["tag"] is None and event["step"] == 3
    for change, what in (
        ({"tag": "train/loss"}, "alert tag must be nil"),
        ({"level": "fatal"}, "alert level must be one of"),
        ({"rule": ""}, "alert rule must be a short str"),
        ({"message": 3}, "alert message must be a str"),
        ({"value": "x"}, "alert value must be a number or nil"),
        ({"series": "a\x00"}, "alert series must not contain control characters"),
    ):
        with pytest.raises(codec.ProtocolError, match=what):
            codec.check_event({**event, **change})


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "text"),
    [
        ((3, "t"), {}, TypeError, "title must be a str, got int 3"),
        (("", "t"), {}, ValueError, "title must be a non-empty str"),
        (("t", None), {}, TypeError, "text must be a str, got NoneType"),
        (("t", "x" * 5000), {}, ValueError, "text must be at most 4096 characters, got 5000"),
        (("t", "x"), {"level": "fatal"}, ValueError, "level must be one of"),
        (("t", "x"), {"level": 2}, TypeError, "level must be a str, got int 2"),
        (("t", "x"), {"step": 1.5}, TypeError, "step"),
        (("t", "x"), {"walltime": float("nan")}, ValueError, "walltime"),
    ],
)
def test_writer_alert_checks_its_arguments_and_loses_nothing(tmp_path, args, kwargs, error, text):
    with attach(tmp_path, run="r", telemetry=False) as w:
        w.add_scalar("a", 1.0, 0)
        with pytest.raises(error, match=text):
            w.alert(*args, **kwargs)
        w.alert("kept", "after a refused call", "info", step=7)
    with recorder.RunReader(tmp_path / "r") as reader:
        assert len(reader.read_scalars("a")) == 1
        [record] = reader.read_records(kind="alert")
    assert record.data["title"] == "kept" and record.data["level"] == "info"
    assert record.step == 7 and record.data["rule"] == "user"


def test_log_writer_and_summary_writer_alert(tmp_path):
    from vdl_stream import LogWriter, SummaryWriter

    with LogWriter(logdir=str(tmp_path / "vdl"), telemetry=False) as w:
        w.alert("from LogWriter", "text", "error", step=1)
        with pytest.raises(ValueError, match="level must be one of"):
            w.alert("t", "x", "loud")
    with SummaryWriter(log_dir=str(tmp_path / "tb"), telemetry=False) as w:
        w.alert("from SummaryWriter", "text")
    for run, title, level in (
        ("vdl", "from LogWriter", "error"),
        ("tb", "from SummaryWriter", "warn"),
    ):
        with recorder.RunReader(tmp_path / run) as reader:
            [record] = reader.read_records(kind="alert")
        assert (record.data["title"], record.data["level"]) == (title, level)


# -- detectors on real demo runs (the engine's pure core) ---------------------------------------


def _alerts(steps: int, **faults: Any) -> list[dict[str, Any]]:
    engine = AlertEngine()
    sink = alert_faults.Collect(engine)
    alert_faults.train(sink, steps, **faults)
    sink.flush()
    return [event for _, event in engine.pending()]


def test_lr_times_100_is_caught_as_divergence_and_spike():
    alerts = _alerts(2000, lr_boost_at=1200)
    rules = {(a["rule"], a["series"]) for a in alerts}
    assert ("spike", "train/loss") in rules and ("divergence", "train/loss") in rules
    for a in alerts:
        assert 1200 <= a["step"] <= 1230, a  # caught within a few steps of the fault


def test_a_nan_loss_is_caught_at_its_step():
    alerts = _alerts(1000, nan_at=700)
    assert [(a["rule"], a["series"], a["step"]) for a in alerts] == [("nan", "train/loss", 700)]
    assert alerts[0]["level"] == "error" and alerts[0]["value"] is None


def test_gradients_times_1e6_are_caught_as_exploding():
    alerts = _alerts(1000, grad_scale_at=600)
    explode = [a for a in alerts if a["rule"] == "gradient_explode"]
    assert [(a["series"], a["step"]) for a in explode] == [("grads/w1", 600)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_alert_over_a_normal_demo_run(seed):
    """The issue's target is 0 alerts over 10 normal runs of 5,000 steps (bench/bench_alerts.py
    --false-positives measures that); here 3 seeds of 2,500 steps keep the suite quick."""
    assert _alerts(2500, seed=seed) == []


def test_a_repeated_fault_raises_one_alert_and_many_tags_are_rate_limited():
    engine = AlertEngine()
    walls = np.full(5, 1.7e9)
    for i in range(50):  # NaN every batch: the condition holds, one alert
        cols = codec.ScalarColumns("loss", np.arange(i * 5, i * 5 + 5), walls, np.full(5, np.nan))
        engine.process("r", [cols], [], float(i))
    assert [a["rule"] for _, a in engine.pending()] == ["nan"]
    for i in range(100):  # an Inf in each of 100 tags: 20 alerts a minute at most, that one too
        cols = codec.ScalarColumns(f"t{i}", np.arange(1), walls[:1], np.array([np.inf]))
        engine.process("r", [cols], [], 0.0)
    assert len(engine.pending()) == 19
    assert engine.statistics().suppressed == 81


# -- rules -------------------------------------------------------------------------------------


def test_rules_file_tunes_and_disables_detectors_per_tag(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text(
        "[spike]\nthreshold = 40\n\n[stall]\nmin_seconds = 5\n\n"
        '[[tags]]\nmatch = "train/loss"\nnan = false\n\n'
        '[[tags]]\nmatch = ["eval/*"]\nspike = { window = 50 }\n'
    )
    rules = load_rules(path)
    assert rules.for_tag("nan", "train/loss") is None
    assert rules.for_tag("nan", "train/accuracy")["enabled"]
    assert rules.for_tag("spike", "train/accuracy")["threshold"] == 40.0
    eval_spike = rules.for_tag("spike", "eval/loss")
    assert (eval_spike["window"], eval_spike["threshold"]) == (50, 40.0)
    assert rules.for_tag("spike", "train/lr") is None  # excluded by default: a schedule moves
    assert rules.params("stall")["min_seconds"] == 5.0
    engine = AlertEngine(rules)
    cols = codec.ScalarColumns("train/loss", np.arange(1), np.full(1, 1.7e9), np.array([np.nan]))
    engine.process("r", [cols], [], 0.0)
    assert engine.pending() == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[spikes]\n", "unknown detector 'spikes'"),
        ("[spike]\nthreshold = 'high'\n", "spike.threshold must be a number"),
        ("[spike]\nwindoww = 3\n", "spike has no setting 'windoww'"),
        ("[[tags]]\nspike = false\n", r"tags\[0\] must be a table with a match glob"),
        ('[[tags]]\nmatch = "a"\nstall = false\n', r"tags\[0\].stall is not a per-tag detector"),
        ("[spike\n", "not valid TOML"),
    ],
)
def test_bad_rules_files_name_the_key(tmp_path, text, message):
    path = tmp_path / "rules.toml"
    path.write_text(text)
    with pytest.raises(RulesError, match=message):
        load_rules(path)


def test_serve_refuses_a_bad_rules_file_in_one_line(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text("[spike]\nthreshold = -1\n")
    result = subprocess.run(
        [sys.executable, "-m", "vdl_stream.cli", "serve", "--logdir", str(tmp_path), "--port", "0",
         "--alerts", str(path)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 2
    assert "spike.threshold must be a finite number >= 0, got -1" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_rules_from_dict_rejects_non_tables():
    with pytest.raises(RulesError, match="must be a table or true/false"):
        rules_from_dict({"spike": 3})


# -- the live path: a real server, a real writer process, a WebSocket client ----------------------

LIVE_RULES = """
[stall]
min_seconds = 1.5

[crash]
grace = 1.0

[gpu_underuse]
seconds = 1.0
"""


@pytest.fixture(scope="module")
def alert_server(tmp_path_factory):
    """``vdl-stream serve --alerts`` with short stall, crash and GPU thresholds."""
    root = tmp_path_factory.mktemp("alerts")
    rules = root / "rules.toml"
    rules.write_text(LIVE_RULES)
    server = start_serve(root / "logs", "--alerts", str(rules))
    try:
        yield server
    finally:
        stop_serve(server)


def _writer(server, run: str, fault: str, steps: int = 600) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "alert_writer.py"), server.ws_url, run, fault,
         str(steps)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip


async def _wait_line(proc: subprocess.Popen, word: str) -> float:
    """Wait (in a thread) for the writer to print ``word``; return when it did."""
    while True:
        line = await trio.to_thread.run_sync(proc.stdout.readline)
        if not line:
            raise AssertionError(f"the writer exited (code {proc.wait()}) before {word!r}")
        if line.strip() == word:
            return time.time()


async def _alerts_of(ws_url: str, run: str, rules: set[str], seconds: float) -> list:
    """Subscribe on /ws/live; return ``(received, alert)`` for alerts of ``run`` until one of each
    of ``rules`` arrived, or ``seconds`` passed."""
    out: list[tuple[float, dict[str, Any]]] = []
    async with open_websocket_url(ws_url + "/ws/live") as ws:
        await ws.send_message(msgpack.packb({"type": "subscribe", "runs": [run], "tags": None}))
        with trio.move_on_after(seconds):
            while not rules <= {a["rule"] for _, a in out}:
                message = msgpack.unpackb(await ws.get_message(), raw=False)
                if message.get("type") == "data" and message.get("run") == run:
                    now = time.time()
                    out.extend((now, e) for e in message["events"] if e.get("kind") == "alert")
    return out


async def _live(alert_server, run: str, fault: str, rules: set[str], seconds: float = 60):
    """Run a writer with ``fault``; once its run exists (``ready``, step 50, before the fault at
    step 300), watch it on /ws/live, so that alerts come in ``data`` frames as they happen."""
    proc = _writer(alert_server, run, fault)
    try:
        await _wait_line(proc, "ready")
        return proc, await _alerts_of(alert_server.ws_url, run, rules, seconds)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


@pytest.mark.parametrize(
    ("fault", "expected"),
    [("lr", {"spike", "divergence"}), ("nan", {"nan"}), ("grad", {"gradient_explode"})],
)
async def test_a_fault_reaches_a_websocket_client_within_a_second(alert_server, fault, expected):
    run = f"live-{fault}"
    proc, got = await _live(alert_server, run, fault, expected)
    try:
        rules = {a["rule"] for _, a in got}
        assert expected <= rules, got
        for received, alert in got:
            if alert["rule"] in expected:
                # wall: when the offending point or histogram was logged in the writer process
                assert received - alert["wall"] <= 1.0, (alert, received)
        assert await trio.to_thread.run_sync(proc.wait, 60) == 0
    finally:
        proc.kill()
        proc.wait()
    status, body = await trio.to_thread.run_sync(
        http_get, f"{alert_server.url}/api/alerts?run={run}"
    )
    assert status == 200
    assert expected <= {a["rule"] for a in body["alerts"]}  # recorded in the run: they persist
    assert all(a["kind"] == "alert" and a["tag"] is None for a in body["alerts"])


async def test_a_paused_loop_is_reported_as_stalled(alert_server):
    proc = _writer(alert_server, "live-pause", "pause")
    try:
        got: list = []
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                got.extend(await _alerts_of(alert_server.ws_url, "live-pause", {"stall"}, 60))

            nursery.start_soon(watch)
            paused = await _wait_line(proc, "paused")
        [(received, alert)] = [(r, a) for r, a in got if a["rule"] == "stall"]
        assert alert["series"] is None and alert["step"] == 299
        assert received - paused <= 1.5 + 1.0  # the stall threshold + 1 s
        assert {a["rule"] for _, a in got} == {"stall"}
    finally:
        proc.kill()
        proc.wait()


async def test_a_sigkilled_writer_is_reported_as_crashed(alert_server):
    proc = _writer(alert_server, "live-kill", "kill")
    try:
        got: list = []
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                got.extend(await _alerts_of(alert_server.ws_url, "live-kill", {"crash"}, 60))

            nursery.start_soon(watch)
            await _wait_line(proc, "paused")
            proc.kill()  # SIGKILL: no close marker, the connection just ends
            killed = time.time()
        crashes = [(r, a) for r, a in got if a["rule"] == "crash"]
        assert len(crashes) == 1, got
        assert crashes[0][0] - killed <= 1.0 + 1.0  # the crash grace + 1 s
        assert crashes[0][1]["level"] == "error"
    finally:
        proc.kill()
        proc.wait()


async def test_a_gpu_at_10_percent_is_reported_as_underused(alert_server):
    # Watched from the start: the rule's 1 s may pass before the writer's step 50.
    proc = _writer(alert_server, "live-gpu", "gpu")
    try:
        got = await _alerts_of(alert_server.ws_url, "live-gpu", {"gpu_underuse"}, 60)
        [(received, alert)] = [(r, a) for r, a in got if a["rule"] == "gpu_underuse"]
        assert alert["series"] == "gpu0/util" and alert["value"] == 10.0
        assert received - alert["wall"] <= 1.0
    finally:
        proc.kill()
        proc.wait()


async def test_a_closed_normal_run_raises_nothing(alert_server):
    proc, _ = await _live(alert_server, "live-none", "none", {"never"}, seconds=0.1)
    assert await trio.to_thread.run_sync(proc.wait, 60) == 0
    await trio.sleep(2.0)  # past the stall threshold: a closed run does not stall
    status, body = await trio.to_thread.run_sync(
        http_get, f"{alert_server.url}/api/alerts?run=live-none"
    )
    assert (status, body["alerts"]) == (200, [])
    status, body = await trio.to_thread.run_sync(
        http_get, f"{alert_server.url}/api/alerts?run=nope"
    )
    assert status == 404


# -- webhooks, against local HTTP servers on 127.0.0.1 ----------------------------------------------


class _Hooks:
    """A local HTTP server: ``/ok`` records each POST, ``/fail`` answers 500 (counted), ``/hang``
    holds the request until the test ends."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.posts: list[tuple[str, float, dict]] = []
        self.fails = 0
        self.release = threading.Event()
        hooks = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/hang":
                    hooks.release.wait(30)
                    return
                if self.path == "/fail":
                    hooks.fails += 1
                    self.send_response(500)
                    self.end_headers()
                    return
                hooks.posts.append((self.path, time.time(), json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks():
    server = _Hooks()
    try:
        yield server
    finally:
        server.close()


async def _until(condition: Any, seconds: float = 10.0) -> None:
    # The condition is changed by the HTTP server's threads, which cannot set a trio.Event.
    with trio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.01)


def test_payload_shapes_of_slack_feishu_and_dingtalk():
    from vdl_stream.webhooks import Webhook, payload

    alert = alert_event("Spike: train/loss", "train/loss = 20", "error", step=5, value=20.0)
    slack = Webhook.parse("https://hooks.slack.com/services/T/B/X")
    feishu = Webhook.parse("https://open.feishu.cn/open-apis/bot/v2/hook/abc")
    ding = Webhook.parse("https://oapi.dingtalk.com/robot/send?access_token=t")
    other = Webhook.parse("http://127.0.0.1:9/hook")
    assert [h.format for h in (slack, feishu, ding, other)] == [
        "slack",
        "feishu",
        "dingtalk",
        "json",
    ]
    assert Webhook.parse("http://127.0.0.1:9/x", "feishu").format == "feishu"
    text = "[vdl-stream ERROR] Spike: train/loss (run r, step 5)\ntrain/loss = 20"
    assert payload("slack", "r", alert) == {"text": text}
    assert payload("feishu", "r", alert) == {"msg_type": "text", "content": {"text": text}}
    assert payload("dingtalk", "r", alert) == {"msgtype": "text", "text": {"content": text}}
    body = payload("json", "r", alert)
    assert body["run"] == "r" and body["rule"] == "user" and body["value"] == 20.0
    json.dumps(body, allow_nan=False)
    assert "access_token" not in repr(ding)  # the secret stays out of logs
    with pytest.raises(ValueError, match="webhook must be an http:// or https:// URL"):
        Webhook.parse("ftp://x/y")
    with pytest.raises(ValueError, match="webhook format must be one of"):
        Webhook.parse("http://x/y", "teams")


async def test_a_hanging_hook_and_a_failing_hook_never_hold_back_a_good_one(hooks):
    from vdl_stream.webhooks import Webhook, WebhookNotifier

    notifier = WebhookNotifier(
        [Webhook.parse(hooks.url + p) for p in ("/hang", "/fail", "/ok")],
        timeout=0.5, backoff=0.05, rate=100.0, burst=10,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(notifier.run)
        started = time.time()
        for i in range(3):
            notifier.notify("r", alert_event(f"alert {i}", "text", step=i))
        assert time.time() - started < 0.05  # notify never waits
        await _until(lambda: len(hooks.posts) == 3, 5.0)
        assert [p[2]["title"] for p in hooks.posts] == ["alert 0", "alert 1", "alert 2"]
        assert hooks.posts[-1][1] - started < 1.0  # not behind the hanging hook's timeouts
        await _until(lambda: notifier.statistics().failed == 6, 20.0)  # 3 alerts x 2 bad hooks
        stats = notifier.statistics()
        assert hooks.fails == 9  # 3 tries for each alert at the 500 hook
        assert (stats.sent, stats.retries, stats.dropped) == (3, 12, 0)
        nursery.cancel_scope.cancel()


async def test_a_full_webhook_queue_drops_and_counts(hooks):
    from vdl_stream.webhooks import Webhook, WebhookNotifier

    notifier = WebhookNotifier([Webhook.parse(hooks.url + "/hang")], queue_size=2, timeout=5)
    for i in range(10):  # not running: nothing is taken from the queue
        notifier.notify("r", alert_event(f"a{i}", ""))
    stats = notifier.statistics()
    assert (stats.queued, stats.dropped, stats.depth) == (2, 8, 2)


async def test_the_rate_limit_spaces_posts(hooks):
    from vdl_stream.webhooks import Webhook, WebhookNotifier

    notifier = WebhookNotifier([Webhook.parse(hooks.url + "/ok")], rate=10.0, burst=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(notifier.run)
        for i in range(6):
            notifier.notify("r", alert_event(f"a{i}", ""))
        await _until(lambda: len(hooks.posts) == 6, 10.0)
        times = [t for _, t, _ in hooks.posts]
        # 2 at once (the burst), then one per 0.1 s: the last about 0.4 s after the first
        assert times[-1] - times[0] >= 0.3
        nursery.cancel_scope.cancel()


def test_serve_posts_alerts_to_webhooks_while_ingest_carries_on(tmp_path, hooks):
    server = start_serve(
        tmp_path / "logs",
        "--webhook", hooks.url + "/hang",
        "--webhook", hooks.url + "/fail",
        "--webhook", hooks.url + "/ok",
        "--webhook-format", "slack",
    )  # fmt: skip
    try:
        proc = _writer(server, "hooked", "nan", 600)
        assert proc.wait(120) == 0
        deadline = time.monotonic() + 20
        while not hooks.posts and time.monotonic() < deadline:
            time.sleep(0.05)
        [(path, _, body)] = hooks.posts
        assert path == "/ok" and body["text"].startswith(
            "[vdl-stream ERROR] NaN or Inf: train/loss"
        )
        status, tags = http_get(f"{server.url}/api/tags?run=hooked")
        assert status == 200 and tags["tags"]["train/loss"]["count"] == 600  # nothing lost
        status, stats = http_get(f"{server.url}/api/stats")
        assert stats["alerts"]["raised"] >= 1 and stats["alerts"]["dropped"] == 0
        # A hook that hangs does not hold the shutdown: SIGTERM ends the server cleanly.
        assert stop_serve(server) == 0
    finally:
        stop_serve(server)


def test_the_documented_rules_file_example_is_valid():
    import tomllib

    text = (ROOT / "docs" / "alerts.md").read_text(encoding="utf-8")
    [example] = [
        b for b in (c.split("```")[0] for c in text.split("```toml")[1:]) if "[[tags]]" in b
    ]
    rules = rules_from_dict(tomllib.loads(example))
    assert rules.params("gpu_memory")["enabled"] is False
    assert rules.for_tag("plateau", "train/loss") is None
    assert rules.for_tag("spike", "val/acc")["window"] == 50


def test_replay_keeps_the_alerts_of_a_run(tmp_path):
    from vdl_stream.replay import load_timelines

    with attach(tmp_path, run="r", telemetry=False) as w:
        w.add_scalar("loss", 1.0, 0)
        w.alert("checkpoint failed", "disk full", "error", step=0)
    [timeline] = load_timelines(str(tmp_path))
    timeline.move_to(float("inf"))
    _, events = timeline.snapshot_at(timeline.cursor(), 100)
    [alert] = [e for e in events if e["kind"] == "alert"]
    assert (alert["title"], alert["level"], alert["rule"]) == ("checkpoint failed", "error", "user")


def test_alerts_off_goes_without_webhooks(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "vdl_stream.cli", "serve", "--logdir", str(tmp_path), "--port", "0",
         "--alerts", "off", "--webhook", "http://127.0.0.1:9/x"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--webhook needs the alert detectors" in result.stderr


# -- a run written by another process, only followed from disk by serve ---------------------------

# A training job with its own in-process broker (no server, so no detectors of its own): logs a
# normal loss, says "ready", logs a NaN loss and raises an alert of its own when told to ("nan" on
# its standard input) and says when, then closes once its standard input closes.
FOLLOWED_WRITER = """
import sys, time
from vdl_stream import attach
with attach(sys.argv[1], run="followed", telemetry=False) as w:
    for step in range(100):
        w.add_scalar("train/loss", 1.0 / (step + 1), step)
    w.flush(timeout=10)
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "nan"
    w.add_scalar("train/loss", float("nan"), 100)
    w.alert("checkpoint failed", "disk full", step=100)
    w.flush(timeout=10)
    print("nan", time.time(), flush=True)
    sys.stdin.read()
"""

#: serve's follow interval (1 s) plus the detectors' round, with slack for a loaded machine.
FOLLOWED_LATENCY = 3.0


def _followed_writer(logdir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", FOLLOWED_WRITER, str(logdir)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip


async def test_serve_alerts_on_a_run_another_process_writes(tmp_path, hooks):
    logdir = tmp_path / "logs"
    proc = _followed_writer(logdir)
    server = None
    try:
        with trio.fail_after(60):
            await _wait_line(proc, "ready")
            server = start_serve(logdir, "--webhook", hooks.url + "/ok")
            async with open_websocket_url(server.ws_url + "/ws/live") as ws:
                subscribe = {"type": "subscribe", "runs": ["followed"], "tags": None}
                await ws.send_message(msgpack.packb(subscribe))
                while True:  # subscribed once the run's snapshot came
                    message = msgpack.unpackb(await ws.get_message(), raw=False)
                    if message.get("type") == "snapshot" and message.get("run") == "followed":
                        break
                proc.stdin.write("nan\n")
                proc.stdin.flush()
                line = await trio.to_thread.run_sync(proc.stdout.readline)
                logged = float(line.split()[1])
                alerts: list[dict[str, Any]] = []  # the writer's own (read from the run) too
                while not any(a["rule"] == "nan" for a in alerts):
                    message = msgpack.unpackb(await ws.get_message(), raw=False)
                    if message.get("type") == "data" and message.get("run") == "followed":
                        alerts += [e for e in message["events"] if e.get("kind") == "alert"]
                received = time.time()
            [alert] = [a for a in alerts if a["rule"] == "nan"]
            assert (alert["rule"], alert["series"], alert["step"]) == ("nan", "train/loss", 100)
            assert received - logged <= FOLLOWED_LATENCY, (logged, received)
            status, body = await trio.to_thread.run_sync(
                http_get, server.url + "/api/alerts?run=followed"
            )
            assert status == 200
            # The held one with the one recorded in the run, by wall time.
            assert [(a["rule"], a["step"]) for a in body["alerts"]] == [("nan", 100), ("user", 100)]
            # Posted: this server's own, and training code's (its process posts nothing).
            await _until(lambda: len(hooks.posts) >= 2)
            assert sorted((p[2]["run"], p[2]["rule"]) for p in hooks.posts) == [
                ("followed", "nan"),
                ("followed", "user"),
            ]
            _, stats = await trio.to_thread.run_sync(http_get, server.url + "/api/stats")
            assert stats["alerts"]["raised"] == 1 and stats["alerts"]["failed"] == 0
            async with open_websocket_url(server.ws_url + "/ws/live") as ws:  # a later page
                await ws.send_message(msgpack.packb(subscribe))
                while True:
                    message = msgpack.unpackb(await ws.get_message(), raw=False)
                    if message.get("type") == "snapshot" and message.get("run") == "followed":
                        break
            assert [e["rule"] for e in message["events"] if e["kind"] == "alert"] == ["nan", "user"]
        proc.stdin.close()
        assert await trio.to_thread.run_sync(proc.wait, 30) == 0
    finally:
        if server is not None:
            stop_serve(server)
        proc.kill()
        proc.wait()
    # The server's alert is not recorded in the run: it never held the run's writer lock.
    reader = recorder.RunReader(logdir / "followed")
    try:
        assert [r.data["rule"] for r in reader.read_records(kind="alert")] == ["user"]
    finally:
        reader.close()


async def test_a_followed_run_tells_the_detectors_where_its_tags_began(tmp_path):
    """A server that finds a run another process is writing follows it from its end: the
    detectors never see its first steps, but are told where each scalar tag began in its files
    (the plateau rule's run length counts from there), before its first batch is judged."""
    from vdl_stream.broker import Broker

    logdir = tmp_path / "logs"
    proc = _followed_writer(logdir)  # steps 0-99 before the broker starts, then step 100
    broker = Broker(logdir)
    engine = AlertEngine()
    try:
        with trio.fail_after(60):
            await _wait_line(proc, "ready")
            async with trio.open_nursery() as nursery:
                await nursery.start(broker.run)
                await nursery.start(engine.run, broker)
                await nursery.start(broker.follow, 0.05)
                # What is in the run's files when its reader opens is its history: step 100
                # must come after that (the follow loop opens it soon after finding it).
                runs = broker._runs
                await _until(lambda: "followed" in runs and runs["followed"].position is not None)
                proc.stdin.write("nan\n")
                proc.stdin.flush()
                line = await trio.to_thread.run_sync(proc.stdout.readline)
                assert line.startswith("nan"), line
                await _until(lambda: engine.statistics().raised >= 1, 30)
                state = engine._runs["followed"]
                assert state.first_steps == {"train/loss": 0}
                assert state.last_step == 100  # it saw step 100 only, and raised its NaN
                broker.close()
                await broker.wait_closed()
                nursery.cancel_scope.cancel()
        proc.stdin.close()
        assert await trio.to_thread.run_sync(proc.wait, 30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_the_plateau_rule_counts_a_joined_runs_length_from_its_first_step():
    """A run seen from step 2,500, flat since (a long run's slow final phase): with its history
    told, the plateau rule waits as it would have for the whole run (half of 4,600 steps); not
    told, it counts from the first step seen and calls it a plateau after 2,000 steps."""
    rng = np.random.default_rng(3)
    s = np.arange(2500, 4600)
    values = 5e-4 * (1 + 0.01 * rng.standard_normal(len(s)))
    raised = {}
    for told in (True, False):
        engine = AlertEngine()
        if told:
            engine.history("r", {"train/loss": 0})
        for a in range(0, len(s), 30):
            cols = codec.ScalarColumns(
                "train/loss", s[a : a + 30], 1.7e9 + s[a : a + 30], values[a : a + 30]
            )
            engine.process("r", [cols], [], 0.0)
        raised[told] = [e["rule"] for _, e in engine.pending()]
    assert raised == {True: [], False: ["plateau"]}


# -- rounds --------------------------------------------------------------------------------------


@pytest.mark.parametrize("on_loop", [True, False])
async def test_batches_joined_for_a_round_report_each_alert_at_its_own_point(
    tmp_path, on_loop, monkeypatch
):
    """Batches queued between two detector rounds are judged together (a tag's columns joined);
    an alert still names the offending point's own step and wall time, and the smoothing sees
    every point in order; with rounds on the event loop (in slices) or in a worker thread."""
    from vdl_stream import alerts
    from vdl_stream.broker import Broker

    monkeypatch.setattr(alerts, "DETECT_ON_LOOP", on_loop)
    monkeypatch.setattr(alerts, "DETECT_SLICE", 0.0 if on_loop else alerts.DETECT_SLICE)

    got: list[dict[str, Any]] = []
    broker = Broker(tmp_path)
    engine = AlertEngine(notify=lambda run, event: got.append(event))
    rng = np.random.default_rng(0)
    points, batches = 30, 40
    nan_step, spike_step = 31 * points + 7, 25 * points + 11
    values = np.exp(rng.normal(0, 0.1, points * batches))
    values[nan_step] = np.nan
    values[spike_step] = 1e4
    walls = 1.7e9 + np.arange(points * batches) * 0.25
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(engine.run, broker)
            for seq in range(1, batches + 1):  # far faster than a round: most are joined
                cut = slice((seq - 1) * points, seq * points)
                cols = codec.ScalarColumns(
                    "train/loss", np.arange(points * batches)[cut], walls[cut], values[cut]
                )
                await broker.ingest(codec.Batch("w", seq, "r", [cols]))
            # Until every batch was judged, not only the two alerts raised: under load the
            # batches after the NaN's may come in a later round than the alerts (this test
            # used to read the counters then, and fail on observed and the smoothing's count).
            with trio.move_on_after(20):
                while len(got) < 2 or engine.statistics().observed < batches:  # noqa: ASYNC110
                    await trio.sleep(0.01)  # (the notify callback and the counters set no event)
            stats = engine.statistics()
            assert len(got) >= 2 and stats.observed == batches, (got, stats)
            broker.close()
            await broker.wait_closed()
    by_rule = {a["rule"]: a for a in got}
    assert set(by_rule) == {"nan", "spike"}, got
    assert (by_rule["nan"]["step"], by_rule["nan"]["wall"]) == (nan_step, walls[nan_step])
    assert (by_rule["spike"]["step"], by_rule["spike"]["wall"]) == (spike_step, walls[spike_step])
    assert by_rule["spike"]["value"] == 1e4
    assert stats.observed == batches and stats.dropped == 0
    # Every finite point reached the smoothing once (a long column is folded in 32 groups, so
    # its EMA is close to, not equal to, the point-by-point one).
    ema = None
    for x in values[np.isfinite(values)]:
        ema = x if ema is None else ema + 0.05 * (x - ema)
    state = engine._runs["r"].tags["train/loss"]
    assert state.emas[0.05].n == points * batches - 1
    assert state.emas[0.05].ema == pytest.approx(ema, rel=0.05)


@pytest.mark.parametrize("on_loop", [True, False])
async def test_batches_that_come_in_late_are_judged_before_the_counters_say_so(
    tmp_path, on_loop, monkeypatch
):
    """``observed`` counts a batch once its round is done, so that waiting on it waits for the
    detectors' verdict: batches ingested while a round waits for its interval come in the next
    round, and only then are counted (they were counted as the round took them, before: with
    the round in a worker thread a test could read the count before the verdict)."""
    from vdl_stream import alerts
    from vdl_stream.broker import Broker

    monkeypatch.setattr(alerts, "DETECT_ON_LOOP", on_loop)
    monkeypatch.setattr(alerts, "DETECT_SLICE", 0.0 if on_loop else alerts.DETECT_SLICE)

    got: list[dict[str, Any]] = []
    broker = Broker(tmp_path)
    engine = AlertEngine(notify=lambda run, event: got.append(event))
    values = np.exp(np.random.default_rng(1).normal(0, 0.1, 300))
    values[280] = np.nan
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(engine.run, broker)
            for seq in range(1, 11):
                cut = slice((seq - 1) * 30, seq * 30)
                cols = codec.ScalarColumns(
                    "train/loss", np.arange(300)[cut], np.arange(300.0)[cut], values[cut]
                )
                await broker.ingest(codec.Batch("w", seq, "r", [cols]))
                if seq == 9:  # a slow writer: the NaN's batch comes in a round of its own
                    await trio.sleep(0.3)
            while engine.statistics().observed < 10:
                assert not got, got  # the NaN's round is not done: nothing raised yet
                await trio.sleep(0.005)
            # Counted once judged: the NaN's alert is raised by then.
            assert engine._runs["r"].tags["train/loss"].seen == 299
            broker.close()
            await broker.wait_closed()


async def test_a_writer_faster_than_the_rounds_has_every_batch_judged(tmp_path, caplog):
    """A queue past half its bounds starts the next round at once instead of after the round
    interval: a writer that fills it within an interval (16M points/s in process) has its
    batches judged, not dropped (with 8 places, 5 of 40 batches were dropped before)."""
    from vdl_stream.broker import Broker

    broker = Broker(tmp_path)
    engine = AlertEngine(queue_size=8)
    rng = np.random.default_rng(2)
    batches = 40
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await nursery.start(engine.run, broker)
            for seq in range(1, batches + 1):  # no sleep: many batches per round interval
                steps = np.arange((seq - 1) * 30, seq * 30)
                cols = codec.ScalarColumns("train/loss", steps, steps * 0.1, rng.random(30) + 1)
                await broker.ingest(codec.Batch("w", seq, "r", [cols]))
            while engine.statistics().observed + engine.statistics().dropped < batches:  # noqa: ASYNC110
                await trio.sleep(0.01)
            stats = engine.statistics()
            broker.close()
            await broker.wait_closed()
    assert (stats.observed, stats.dropped, stats.dropped_points) == (batches, 0, 0), stats
    assert stats.queue_peak <= 8
    assert engine._runs["r"].tags["train/loss"].seen == batches * 30
    assert "fell behind" not in caplog.text


async def test_a_round_that_took_a_millisecond_or_more_spaces_the_next_ones(autojump_clock):
    """Rounds whose own clock reads 1% of a core or more are spread out (at most 0.5 s apart):
    what the event loop pays for them is two to three times that clock, and at 5% a fast
    writer of small batches in process had a round every 0.1 s and paid +125 ns an event on
    the loop at load 13 (docs/performance.md, "(2026-12-01, h5-alerts)"). A round of 2 ms is
    followed by 0.2 s or more; a quick one by the 0.1 s of DETECT_INTERVAL."""
    from vdl_stream import alerts

    starts: list[float] = []
    cost = [0.002]

    class Timed(AlertEngine):
        def _steps(self, pending):
            starts.append(trio.current_time())
            began = time.thread_time()
            while time.thread_time() - began < cost[0]:  # CPU the share rule counts
                pass
            return super()._steps(pending)

    engine = Timed()
    steps = np.arange(30)
    cols = codec.ScalarColumns("train/loss", steps, steps * 0.1, np.ones(30))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine._detect)
            for _ in range(200):  # a batch every 10 ms (virtual time), for 2 s
                engine.observe("r", [cols], [])
                await trio.sleep(0.01)
                if len(starts) == 4:
                    cost[0] = 0.0  # quick rounds from here on
                if len(starts) >= 8:
                    break
            nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # 2 ms / DETECT_SHARE at least (the round's own judging adds to its clock), 0.5 s at most
    assert all(0.2 - 0.011 <= g <= alerts.DETECT_MAX_INTERVAL + 0.011 for g in gaps[:3]), gaps
    # The quick rounds' own clock is real CPU too: on a loaded machine one of them can read a
    # millisecond or more (CI once read 1.25 ms: a gap of 0.125 s), so the spacing is judged on
    # their median, and none may stay near the slow rounds' spacing.
    quick = sorted(gaps[4:])
    assert abs(quick[len(quick) // 2] - alerts.DETECT_INTERVAL) <= 0.011, gaps
    assert all(g < 0.19 for g in quick), gaps


def test_a_dropped_batch_is_counted_and_logged_and_what_it_says_of_the_run_is_kept(caplog):
    """A batch that finds the queue full is not judged (counted, logged once a minute), but
    its arrival, its last step and a status change are: a dropped close must not let the run
    read as stalled later, nor dropped data as no data."""
    now = [1000.0]
    engine = AlertEngine(queue_size=1, clock=lambda: now[0])
    steps = np.arange(10)
    first = codec.ScalarColumns("train/loss", steps, steps + 1.7e9, np.ones(10))
    later = codec.ScalarColumns("train/loss", steps + 10, steps + 1.7e9, np.full(10, np.nan))
    closed = {"kind": "meta", "tag": None, "step": None, "wall": 1.7e9, "status": "closed"}
    engine.observe("r", [first], [])
    now[0] += 1.0
    with caplog.at_level("WARNING", logger="vdl_stream.alerts"):
        engine.observe("r", [later], [closed])  # the queue holds one batch: dropped
        engine.observe("r", [later], [])  # logged once, not per batch
    stats = engine.statistics()
    assert (stats.dropped, stats.dropped_points, stats.queue_depth) == (2, 20, 1)
    assert caplog.text.count("the alert detectors fell behind") == 1
    assert "2 batches" not in caplog.text and "1 batches (10 scalar points)" in caplog.text
    pending, taken = engine._take()
    assert taken == 1
    engine._round(pending)
    state = engine._runs["r"]
    assert state.closed and state.last_step == 19 and state.last_data == 1001.0
    assert state.tags["train/loss"].seen == 10  # the dropped NaN column was not judged
    now[0] += 10_000.0
    engine.check_time(now[0])
    assert engine.pending() == []  # neither a NaN nor a stall alert


def test_a_noisy_runs_dropped_status_changes_do_not_push_out_another_runs_close():
    """The status changes of dropped batches are kept per run: a run that flips its status
    in every dropped batch keeps at most KEPT_STATUS of them (the newest always), and another
    run's close, dropped after all of them, is still read (one cap for all runs lost it)."""
    from vdl_stream import alerts

    engine = AlertEngine(queue_size=2)
    ones = codec.ScalarColumns("train/loss", np.arange(3), np.arange(3) + 1.7e9, np.ones(3))
    engine.observe("noisy", [ones], [])
    engine.observe("quiet", [ones], [])  # the queue is full from here on: all below dropped

    def meta(status: str) -> dict:
        return {"kind": "meta", "tag": None, "step": None, "wall": 1.7e9, "status": status}

    for i in range(50):
        engine.observe("noisy", [], [meta("closed" if i % 2 else "running")])
    engine.observe("quiet", [], [meta("closed")])
    engine.observe("noisy", [], [meta("running")])  # its newest: the run is open again
    pending, _ = engine._take()
    kept = len(pending["noisy"].events)
    engine._round(pending)
    assert engine._runs["quiet"].closed
    assert not engine._runs["noisy"].closed
    assert kept <= alerts.KEPT_STATUS
    assert engine.statistics().dropped == 52


@pytest.mark.parametrize("cuts", [[], [30], [49], [50], [51], [30, 60], [600, 601]])
def test_a_spike_and_a_nan_are_found_however_the_points_are_cut_into_columns(cuts):
    """Whether a run's points come in one column or many, and whatever the window holds when a
    column starts (its first points fill it, as one by one they would), the same alerts come
    out at the same steps."""
    rng = np.random.default_rng(0)
    n = 1200
    values = np.exp(rng.normal(0, 0.1, n))
    values[937], values[761] = np.nan, 1e4
    steps, walls = np.arange(n), 1.7e9 + np.arange(n) * 0.25
    engine = AlertEngine()
    for a, b in zip([0, *cuts], [*cuts, n], strict=True):
        cols = codec.ScalarColumns("train/loss", steps[a:b], walls[a:b], values[a:b])
        engine.process("r", [cols], [], 0.0)
    alerts = sorted((e["rule"], e["step"], e["wall"]) for _, e in engine.pending())
    assert alerts == [("nan", 937, walls[937]), ("spike", 761, walls[761])]


@pytest.mark.parametrize("layout", ["same", "empty", "shuffled", "strided", "float32"])
@pytest.mark.parametrize("join", [30, 100, 1 << 16])
def test_a_round_judges_a_tags_groups_in_order_and_reports_each_point(join, layout, monkeypatch):
    """observe() queues each batch as it came; a round groups a run's columns per tag, cut at
    JOIN_POINTS points (a column longer than that alone), and judges every group in order:
    each point reaches the smoothing once, and a NaN and a spike in different groups are
    reported at their own steps and walls. The same whether every batch has the same tags in
    the same order (grouped in C; 60 columns of a tag are joined as bytes), some columns are
    empty (the last batch's among them), the tags' order changes from batch to batch (grouped
    column by column), or values are not contiguous or not float64 (not joined as bytes)."""
    from vdl_stream import alerts

    monkeypatch.setattr(alerts, "JOIN_POINTS", join)
    rng = np.random.default_rng(3)
    n, size = 1200, 20
    values = np.exp(rng.normal(0, 0.1, n))
    values[937], values[761] = np.nan, 1e4
    steps, walls = np.arange(n), 1.7e9 + np.arange(n) * 0.25
    engine = AlertEngine()
    engine._scratch = np.empty(join)  # as the engine makes it, for the patched size
    loss = np.linspace(2.0, 1.5, n) * np.exp(rng.normal(0, 0.1, n))  # noisy, falling
    if layout == "strided":
        loss = np.repeat(loss, 2)[::2]  # the same values, every other one of an array
    elif layout == "float32":
        loss = loss.astype(np.float32)
    none = np.arange(0)
    for i, a in enumerate(range(0, n, size)):
        cut = slice(a, a + size)
        cols = [
            codec.ScalarColumns("val/score", steps[cut], walls[cut], values[cut]),
            codec.ScalarColumns("train/loss", steps[cut], walls[cut], loss[cut]),
        ]
        if layout == "shuffled" and i % 3 == 1:
            cols.reverse()
        engine.observe("r", cols, [])
        if layout == "empty" and (i % 7 == 3 or a + size >= n):
            empty = [codec.ScalarColumns(c.tag, none, none * 1.0, none * 1.0) for c in cols]
            engine.observe("r", empty, [])
    groups = [g[0] for g in engine._groups(engine._pending["r"])]
    assert sum(1 for g in groups for c in g if len(c.values)) == 2 * n // size
    assert all(sum(len(c.values) for c in g) <= max(join, size) for g in groups)
    engine._round(engine._pending)
    alerts_ = sorted((e["rule"], e["step"], e["wall"]) for _, e in engine.pending())
    assert alerts_ == [("nan", 937, walls[937]), ("spike", 761, walls[761])]
    tags = engine._runs["r"].tags
    assert tags["val/score"].seen == n - 1
    assert tags["train/loss"].emas[0.05].n == n
    assert tags["train/loss"].emas[0.05].ema == pytest.approx(1.5, abs=0.1)
    assert engine._runs["r"].last_step == n - 1


def test_a_batch_counted_by_the_broker_is_not_counted_again():
    """observe() takes the points the broker counted (Batch.count) for the queue's bound, and
    counts the columns itself only when not given them."""
    engine = AlertEngine()
    cols = [codec.ScalarColumns("loss", np.arange(5), np.full(5, 1.7e9), np.ones(5))]
    engine.observe("r", cols, [])
    assert engine._points == 5
    engine.observe("r", cols, [], points=7)
    assert engine._points == 12


def test_an_engine_takes_no_attribute_it_does_not_declare():
    """AlertEngine has slots, not an instance dict (past the 30 keys a dict shares with its
    class each read on the ingest path was a hashed lookup): every slot is set by __init__, and
    an undeclared attribute is refused rather than silently kept."""
    engine = AlertEngine()
    assert not hasattr(engine, "__dict__")
    assert all(hasattr(engine, name) for name in AlertEngine.__slots__)
    with pytest.raises(AttributeError):
        engine.queue_size = 3  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from("abcx"), st.integers(0, 3)), min_size=1, max_size=5),
        min_size=1,
        max_size=8,
    ),
    st.integers(4, 12),
)
def test_a_rounds_groups_are_each_tags_columns_in_arrival_order_whatever_the_batches(batches, join):
    """However a run's batches lay out their tags (the same in each, the same sequence cut
    elsewhere, another order, a tag twice, empty columns, a tag no detector watches: "x"), a
    round groups each watched tag's non-empty columns in arrival order, cut at JOIN_POINTS,
    and keeps the newest column of an unwatched one, exactly as column by column
    (``_groups_by_column``): the fast path slices every k-th column only when the columns
    repeat the first batch's tags."""
    import vdl_stream.alerts as alerts_module

    old = alerts_module.JOIN_POINTS
    alerts_module.JOIN_POINTS = join  # small, so that some tags' columns are cut
    try:
        rules = rules_from_dict({"nan": {"exclude": ["x"]}, "spike": {"exclude": ["x"]}})
        engine, reference = AlertEngine(rules), AlertEngine(rules)
        for i, layout in enumerate(batches):
            cols = [
                codec.ScalarColumns(tag, np.arange(n) + i, np.full(n, 1.7e9), np.ones(n))
                for tag, n in layout
            ]
            engine.observe("r", cols, [])
            reference.observe("r", cols, [])
        entry, expected = engine._pending["r"], reference._pending["r"]
        got = engine._groups(entry)
        want = reference._groups_by_column(expected)

        def columns(groups: list) -> list[list[int]]:
            return [[id(c) for c in g[0] if len(c.values)] for g in groups]

        assert columns(got) == columns(want)
        assert [g[1] for g in got] == [g[1] for g in want]
        assert {t: id(c) for t, c in entry.unwatched.items()} == {
            t: id(c) for t, c in expected.unwatched.items()
        }
        for group, _size, values in got:  # the values handed over are the group's own
            if values is not None:
                assert [id(v) for v in values] == [id(c.values) for c in group]
    finally:
        alerts_module.JOIN_POINTS = old


def test_columns_of_a_tag_no_detector_watches_are_not_judged_but_are_data():
    """A tag that no per-tag detector applies to (here: NaN and spike off, and not a loss) is
    not queued for the detectors: no state, no alert even for NaN; its batches still count as
    the run's data (stall cadence) and its steps as the run's last step."""
    engine = AlertEngine(rules_from_dict({"nan": False, "spike": False}))
    lr = codec.ScalarColumns("lr", np.arange(5), np.full(5, 1.7e9), np.full(5, np.nan))
    engine.observe("r", [lr], [])
    assert engine._groups(engine._pending["r"]) == [] and engine._pending["r"].data
    engine._round(engine._pending)
    state = engine._runs["r"]
    assert "lr" not in state.tags and state.last_step == 4 and state.last_data is not None
    assert engine.pending() == []
    loss = codec.ScalarColumns("loss", np.arange(5, 8), np.full(3, 1.7e9), np.ones(3))
    engine.process("r", [loss, lr], [], 1.0)
    assert set(state.tags) == {"loss"} and state.last_step == 7


@pytest.mark.parametrize("cut", [1, 30, 100, 1000])
def test_divergence_counts_rising_points_not_smoothing_groups(cut):
    """``rising_points`` is in points whatever the column sizes: a loss that bottoms out and
    then climbs slowly for 1,000 points (by 60%, under the rule's factor) is diverging whether
    the climb comes a point a column or in one column of 1,000, which the smoothing folds in
    32 groups (a count of groups would be 32, and never reach 300)."""
    values = np.concatenate([np.linspace(2.0, 1.0, 200), np.linspace(1.0, 1.6, 1000)])
    n = len(values)
    steps, walls = np.arange(n), 1.7e9 + np.arange(n) * 0.25
    engine = AlertEngine()
    cuts = [*range(0, 200, min(cut, 200)), *range(200, n, cut), n]
    for a, b in itertools.pairwise(cuts):
        cols = codec.ScalarColumns("train/loss", steps[a:b], walls[a:b], values[a:b])
        engine.process("r", [cols], [], 0.0)
    alerts = [e for _, e in engine.pending()]
    assert [a["rule"] for a in alerts] == ["divergence"], alerts
    assert "rising for" in alerts[0]["message"]
    rising = engine._runs["r"].tags["train/loss"].emas[0.05].rising
    assert 900 <= rising <= 1000, rising  # the EMA turns a few dozen points after the loss


@pytest.mark.parametrize("spike", [True, False])
def test_a_server_joining_a_converged_run_sees_no_divergence_in_its_noise(spike):
    """A server started next to a run far along first sees a loss that converged near zero,
    with noise larger than its level (it dips below zero): the first smoothed value it sees is
    no starting level, and the smoothed noise's swings are several times the best value. No
    divergence on that noise; a real rise afterwards still is one, caught within 100 steps
    (with the spike rule off, the divergence rule keeps the tag's recent values itself)."""
    engine = AlertEngine(None if spike else rules_from_dict({"spike": False}))
    start, rise_at, end = 1500, 4600, 5000
    s = np.arange(start, end)
    values = 2.0 * np.exp(-s / 300) + 0.05 * np.sin(s)
    values[s >= rise_at] += np.linspace(0.0, 2.0, end - rise_at)  # a blow-up of 40x its noise
    walls = 1.7e9 + s * 0.002
    for a in range(0, end - start, 10):  # ten steps a 20 ms flush
        cols = codec.ScalarColumns(
            "train/loss", s[a : a + 10], walls[a : a + 10], values[a : a + 10]
        )
        engine.process("r", [cols], [], 0.0)
    alerts = [e for _, e in engine.pending() if e["rule"] == "divergence"]
    assert len(alerts) == 1, alerts
    assert rise_at < alerts[0]["step"] <= rise_at + 100, alerts[0]


def test_the_spike_rules_bounds_hold_for_every_window_within_its_moves():
    """_centre_bounds: after replacing up to ``moves`` values of a window by any values, the
    window's true median lies within the bounds and its true MAD is at least the lower bound,
    and the median and MAD themselves are _median_mad's to the bit."""
    from vdl_stream.alerts import _centre_bounds, _median_mad

    rng = np.random.default_rng(7)
    for trial in range(400):
        n = int(rng.integers(5, 260))
        window = np.exp(rng.normal(0, 1.0, n)) if trial % 2 else rng.standard_t(2, n)
        moves = int(rng.integers(1, max(2, n // 4)))
        med, mad, low, high, mad_low = _centre_bounds(window, moves)
        assert (med, mad) == _median_mad(window)
        for _ in range(5):
            moved = window.copy()
            k = int(rng.integers(0, moves + 1))
            where = rng.choice(n, k, replace=False)
            moved[where] = rng.choice([-1e9, 1e9, med, 0.0]) + rng.normal(0, 3, k)
            true_med, true_mad = _median_mad(moved)
            assert low <= true_med <= high, (trial, k)
            assert true_mad >= mad_low, (trial, k)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_spike_rules_shortcut_raises_exactly_what_the_full_computation_does(seed, monkeypatch):
    """The spike rule skips computing the median and MAD while the bounds rule out a spike;
    on a heavy-tailed series with spikes, cut into columns of random sizes, it raises the same
    alerts at the same steps as an engine that computes them for every column."""
    from vdl_stream import alerts

    rng = np.random.default_rng(seed)
    n = 6000
    values = np.exp(rng.standard_t(3, n) * 0.3)
    spikes = rng.choice(np.arange(300, n), 12, replace=False)
    values[spikes] *= rng.choice([1e3, 1e-3, 30.0], 12)
    steps, walls = np.arange(n), 1.7e9 + np.arange(n) * 0.25
    cuts = np.unique(np.concatenate([[0, n], rng.integers(1, n, 900)]))

    def run() -> list[tuple]:
        engine = AlertEngine(rules_from_dict({"limits": {"cooldown": 0, "per_minute": 10**6}}))
        for a, b in itertools.pairwise(cuts.tolist()):
            cols = codec.ScalarColumns("val/score", steps[a:b], walls[a:b], values[a:b])
            engine.process("r", [cols], [], 0.0)
        return sorted((e["rule"], e["step"], e["value"]) for _, e in engine.pending())

    exact = alerts._centre_bounds
    calls = []
    monkeypatch.setattr(alerts, "_centre_bounds", lambda w, m: calls.append(1) or exact(w, m))
    fast = run()
    assert len(calls) < len(cuts) / 2  # the shortcut was taken for most columns
    monkeypatch.setattr(alerts, "_centre_bounds", lambda w, m: (*exact(w, m)[:4], 0.0))
    assert fast == run()
    assert sum(rule == "spike" for rule, _, _ in fast) >= 6, fast


def test_gpu_rules_read_telemetry_samples():
    """gpu_underuse and gpu_memory from telemetry events (through gpu_readings, the one reader
    of telemetry): an idle GPU for 120 s and a full one for 10 s are each reported once; a
    busy GPU and fields that are not numbers raise nothing."""
    from vdl_stream.alerts import gpu_readings

    engine = AlertEngine()
    for t in range(0, 200, 5):
        fields = {
            "gpu0/util": 10.0, "gpu0/mem_used": 99.0, "gpu0/mem_total": 100.0,
            "gpu1/util": 95.0, "gpu1/mem_used": 50.0, "gpu1/mem_total": 100.0,
            "gpu2/util": "busy", "cpu/util": 5.0,
        }  # fmt: skip
        event = {"kind": "telemetry", "wall": 1.7e9 + t, "host": "h", "rank": 0, "fields": fields}
        engine.process("r", [], [event], float(t))
    got = sorted((e["rule"], e["series"]) for _, e in engine.pending())
    assert got == [("gpu_memory", "gpu0/mem_used"), ("gpu_underuse", "gpu0/util")]
    readings = gpu_readings(event)
    assert [r[3:] for r in readings] == [("gpu0", 10.0, 99.0, 100.0), ("gpu1", 95.0, 50.0, 100.0)]
    assert gpu_readings({"kind": "telemetry", "wall": 0.0, "fields": None}) == []


async def test_the_detectors_queue_is_bounded_in_batches_and_points(monkeypatch):
    """observe() never blocks: past queue_size batches, or QUEUE_POINTS scalar points, a batch
    is dropped and counted; the detector task then takes the whole queue in one round."""
    from vdl_stream import alerts

    monkeypatch.setattr(alerts, "QUEUE_POINTS", 25)
    engine = AlertEngine(queue_size=3)
    cols = codec.ScalarColumns("loss", np.arange(10), np.full(10, 1.7e9), np.ones(10))
    for _ in range(3):  # 10 + 10 points, then 30 would pass the points bound: dropped
        engine.observe("r", [cols], [])
    stats = engine.statistics()
    assert (stats.queue_depth, stats.queue_peak, stats.dropped) == (2, 2, 1)
    engine.observe("r", [], [{"kind": "meta", "status": "running", "tag": None, "wall": 0.0}])
    engine.observe("r", [], [])  # a fourth batch: past queue_size
    stats = engine.statistics()
    assert (stats.queue_depth, stats.queue_peak, stats.dropped) == (3, 3, 2)

    class Idle:  # a stand-in broker that never closes: the engine runs until cancelled
        alerts = None

        async def wait_closed(self) -> None:
            await trio.sleep_forever()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run, Idle())
            while engine.statistics().observed < 3:  # noqa: ASYNC110 (a counter, no event)
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    stats = engine.statistics()
    assert (stats.observed, stats.queue_depth, stats.dropped) == (3, 0, 2)
    assert engine._runs["r"].tags["loss"].seen == 20


def test_the_benchs_sliced_pairs_judge_and_count_every_batch_once(tmp_path):
    """bench_alerts.py --slices 2: each pair ingests its batches in two parts, off and on in
    turn; the pair's figures are summed over the parts, so the detectors' statistics count
    every batch once (100 small batches judged, none dropped), not the last part's alone."""
    out = tmp_path / "bench.json"
    skip = ["--skip", "detectors", "served", "latency", "false-positives"]
    sizes = ["--paths", "small", "--repeat", "1", "--batches", "5", "--slices", "2"]
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_alerts.py"),
            *skip,
            *sizes,
            "--json",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    small = json.loads(out.read_text())["throughput_small"]
    assert small["slices"] == 2 and small["batches"] == 100
    assert small["detector_stats"]["observed"] == 100
    assert small["dropped_per_run"] == [0]
    assert small["median_on"]["cpu"] > 0 and len(small["cpu_ratio_pairs"]) == 1
