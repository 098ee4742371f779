"""Alerts out of the page: POST each alert as JSON to incoming webhooks (Slack, Feishu, DingTalk,
or any endpoint that takes JSON), from ``vdl-stream serve --webhook URL``.

The alert engine hands each alert to :meth:`WebhookNotifier.notify`, which never blocks: it puts
the alert in a bounded queue and, when the queue is full, drops it and counts the drop. The
notifier's own task sends them, one hook at a time, with a per-hook rate limit, retries with
backoff and a timeout per request, in worker threads (``urllib``), so a hook that hangs or
answers 500 costs only its own deliveries, never ingest.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import trio

log = logging.getLogger("vdl_stream.webhooks")

#: Payload shapes: ``json`` (the alert itself), and those the three chat services accept.
FORMATS = ("auto", "json", "slack", "feishu", "dingtalk")
#: Alerts waiting to be sent, all hooks together; more are dropped and counted.
QUEUE_ALERTS = 256
#: Seconds a request may take (connect, send, answer) before it counts as failed.
TIMEOUT = 5.0
#: Tries per alert and hook, and the backoff before each retry (doubling).
TRIES = 3
BACKOFF = 0.5
#: At most this many posts per hook and second on average, in bursts of up to ``BURST``:
#: Slack allows one message a second per incoming webhook, Feishu 100 a minute, DingTalk 20.
RATE = 1 / 3
BURST = 5
#: Requests in flight at once, all hooks together (each is a worker thread).
THREADS = 4

_HOSTS = {
    "hooks.slack.com": "slack",
    "open.feishu.cn": "feishu",
    "open.larksuite.com": "feishu",
    "oapi.dingtalk.com": "dingtalk",
}


def webhook_format(url: str, fmt: str = "auto") -> str:
    """The payload shape for ``url``: ``fmt`` unless it is ``auto``, then by the URL's host
    (Slack, Feishu/Lark and DingTalk hosts; ``json`` for any other).

    Raises:
        ValueError: ``url`` is not an http(s) URL, or ``fmt`` is not one of :data:`FORMATS`.
    """
    if fmt not in FORMATS:
        raise ValueError(f"webhook format must be one of {list(FORMATS)}, got {fmt!r:.40}")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"webhook must be an http:// or https:// URL, got {url!r:.200}")
    if fmt != "auto":
        return fmt
    return _HOSTS.get(parts.hostname.lower(), "json")


def alert_text(run: str, alert: dict[str, Any]) -> str:
    """One plain-text message for chat services: level, run, title, message."""
    level = str(alert.get("level", "warn")).upper()
    step = alert.get("step")
    where = f"run {run}" + (f", step {step}" if step is not None else "")
    return f"[vdl-stream {level}] {alert.get('title', '')} ({where})\n{alert.get('message', '')}"


def payload(fmt: str, run: str, alert: dict[str, Any]) -> dict[str, Any]:
    """The JSON body for one alert in payload shape ``fmt`` (see :data:`FORMATS`).

    ``json`` is the alert of docs/http-api.md ("Alerts") with ``run`` added; ``slack`` is
    ``{"text"}``; ``feishu`` is ``{"msg_type": "text", "content": {"text"}}``; ``dingtalk`` is
    ``{"msgtype": "text", "text": {"content"}}``.
    """
    if fmt == "slack":
        return {"text": alert_text(run, alert)}
    if fmt == "feishu":
        return {"msg_type": "text", "content": {"text": alert_text(run, alert)}}
    if fmt == "dingtalk":
        return {"msgtype": "text", "text": {"content": alert_text(run, alert)}}
    out = {"run": run}
    for key, value in alert.items():
        if isinstance(value, float) and not math.isfinite(value):
            value = None  # JSON has no NaN or Infinity
        if not isinstance(value, bytes):
            out[key] = value
    return out


@dataclass(frozen=True)
class Webhook:
    """One hook: its URL and payload shape (``auto`` resolved)."""

    url: str
    format: str

    @classmethod
    def parse(cls, url: str, fmt: str = "auto") -> Webhook:
        """A hook for ``url`` (see :func:`webhook_format`). Raises ``ValueError`` on a bad one."""
        return cls(url, webhook_format(url, fmt))

    def __repr__(self) -> str:  # hook URLs carry secrets (Slack's path, DingTalk's token)
        parts = urlsplit(self.url)
        return f"Webhook({parts.scheme}://{parts.netloc}/…, {self.format})"


@dataclass(frozen=True)
class WebhookStatistics:
    """Counters of a :class:`WebhookNotifier`: alerts ``queued``, ``sent`` (one per hook that took
    it), ``failed`` (gave up after every try), ``retries``, ``dropped`` (queue full) and the
    queue's ``depth`` and ``peak``."""

    queued: int
    sent: int
    failed: int
    retries: int
    dropped: int
    depth: int
    peak: int


class WebhookNotifier:
    """Posts alerts to webhooks without ever holding up the caller.

    Args:
        hooks: where to post.
        queue_size: alerts waiting at most; more are dropped and counted.
        timeout: seconds per request.
        tries: attempts per alert and hook (the first included).
        backoff: seconds before the first retry, doubling.
        rate, burst: each hook gets at most ``rate`` posts a second on average, ``burst`` at once.

    Raises:
        ValueError: a non-positive size, count or time.
    """

    def __init__(
        self,
        hooks: Sequence[Webhook],
        *,
        queue_size: int = QUEUE_ALERTS,
        timeout: float = TIMEOUT,
        tries: int = TRIES,
        backoff: float = BACKOFF,
        rate: float = RATE,
        burst: int = BURST,
    ) -> None:
        for name, value in (("queue_size", queue_size), ("tries", tries), ("burst", burst)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name, value in (("timeout", timeout), ("backoff", backoff), ("rate", rate)):
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        self.hooks = list(hooks)
        self._send, self._receive = trio.open_memory_channel[tuple[str, dict[str, Any]]](queue_size)
        self._timeout, self._tries, self._backoff = timeout, tries, backoff
        self._rate, self._burst = rate, burst
        self._limiter = trio.CapacityLimiter(THREADS)
        self._queued = self._sent = self._failed = self._retries = self._dropped = 0
        self._peak = 0
        self._warned: set[str] = set()

    def notify(self, run: str, alert: dict[str, Any]) -> None:
        """Queue ``alert`` of ``run`` for every hook; never blocks (a full queue drops it)."""
        if not self.hooks:
            return
        try:
            self._send.send_nowait((run, alert))
        except trio.WouldBlock:
            self._dropped += 1
            return
        self._queued += 1
        self._peak = max(self._peak, self._send.statistics().current_buffer_used)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver queued alerts until cancelled: one task per hook, so a slow hook delays only
        its own deliveries."""
        async with trio.open_nursery() as nursery:
            channels = []
            for hook in self.hooks:
                send, receive = trio.open_memory_channel[tuple[str, dict[str, Any]]](
                    self._send.statistics().max_buffer_size
                )
                channels.append(send)
                nursery.start_soon(self._deliver, hook, receive)
            task_status.started()
            async for item in self._receive:
                for send in channels:
                    try:
                        send.send_nowait(item)
                    except trio.WouldBlock:  # this hook is far behind: drop for it alone
                        self._dropped += 1

    async def _deliver(
        self, hook: Webhook, receive: trio.MemoryReceiveChannel[tuple[str, dict[str, Any]]]
    ) -> None:
        tokens, refilled = float(self._burst), time.monotonic()
        async for run, alert in receive:
            now = time.monotonic()
            tokens = min(self._burst, tokens + (now - refilled) * self._rate)
            refilled = now
            if tokens < 1:
                await trio.sleep((1 - tokens) / self._rate)
                tokens, refilled = 1.0, time.monotonic()
            tokens -= 1
            body = json.dumps(payload(hook.format, run, alert), ensure_ascii=False).encode()
            await self._post(hook, body)

    async def _post(self, hook: Webhook, body: bytes) -> None:
        delay = self._backoff
        for attempt in range(self._tries):
            if attempt:
                self._retries += 1
                await trio.sleep(delay)
                delay *= 2
            try:
                status = await trio.to_thread.run_sync(
                    _post, hook.url, body, self._timeout,
                    limiter=self._limiter, abandon_on_cancel=True,
                )  # fmt: skip
            except OSError as exc:  # refused, timed out, DNS...
                reason = f"{type(exc).__name__}: {exc}"
                retry = True
            else:
                if 200 <= status < 300:
                    self._sent += 1
                    return
                reason = f"HTTP {status}"
                retry = status == 429 or status >= 500  # a 4xx will not change by retrying
            if not retry:
                break
        self._failed += 1
        if hook.url not in self._warned:
            self._warned.add(hook.url)
            log.warning("webhook %r failed (%s); alerts to it are dropped", hook, reason)

    def statistics(self) -> WebhookStatistics:
        """Return the notifier's counters now."""
        return WebhookStatistics(
            queued=self._queued,
            sent=self._sent,
            failed=self._failed,
            retries=self._retries,
            dropped=self._dropped,
            depth=self._send.statistics().current_buffer_used,
            peak=self._peak,
        )


def _post(url: str, body: bytes, timeout: float) -> int:
    """POST ``body`` as JSON (blocking); return the HTTP status."""
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json; charset=utf-8"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read(1 << 16)
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
