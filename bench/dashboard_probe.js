// Injected by bench/bench_dashboard.py before the page's own scripts (Playwright add_init_script,
// which the page's Content-Security-Policy does not apply to). It times a page load from the
// navigation start (performance.now() = 0): the WebSocket's creation, open and subscribe, every
// frame's arrival and how long the page's onmessage handler took on it (decoding and storing), long
// tasks, and the first animation frame at which the scalar charts in view have data. Everything
// it keeps is bounded. Results: window.__vdlBench. The benchmark sets window.__vdlBenchExpect.
(() => {
  const MAX_FRAMES = 1000;
  const t = { created: null, open: null, sends: [], frames: [], longTasks: [], shown: null, shownCharts: 0, all: null, charts: 0 };
  window.__vdlBench = t;
  const head = (data) => {
    // The first bytes of a msgpack map hold its "type" key and value: enough to name the frame.
    const bytes = new Uint8Array(data, 0, Math.min(48, data.byteLength));
    let s = "";
    for (const b of bytes) s += b >= 32 && b < 127 ? String.fromCharCode(b) : " ";
    for (const type of ["snapshot_events", "snapshot", "hello", "runs", "data", "gap", "frames"]) if (s.includes(type)) return type;
    return "?";
  };
  const Native = window.WebSocket;
  class ProbedWebSocket extends Native {
    constructor(...args) {
      super(...args);
      t.created = performance.now();
      this.addEventListener("open", () => (t.open = performance.now()));
    }
    send(data) {
      if (t.sends.length < MAX_FRAMES) t.sends.push(performance.now());
      return super.send(data);
    }
    set onmessage(fn) {
      super.onmessage = (ev) => {
        const at = performance.now();
        fn.call(this, ev);
        if (t.frames.length < MAX_FRAMES && ev.data instanceof ArrayBuffer) {
          t.frames.push({ at, handled: performance.now() - at, bytes: ev.data.byteLength, type: head(ev.data) });
        }
      };
    }
    get onmessage() {
      return super.onmessage;
    }
  }
  window.WebSocket = ProbedWebSocket;
  try {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) if (t.longTasks.length < MAX_FRAMES) t.longTasks.push([e.startTime, e.duration]);
    }).observe({ type: "longtask", buffered: true });
  } catch {
    // no Long Tasks API: the breakdown just lacks them
  }
  // "shown": every expected tag is known and every scalar chart that intersects the viewport has
  // data. Charts below the fold are built and drawn only when scrolled to (docs/dashboard.md), so
  // "all" (every expected chart has data) may never come without scrolling.
  const hasData = (u) => !!(u && u.data && u.data[0] && u.data[0].length > 0);
  // The boxes are measured (which forces a layout) only when a chart has just got data, or every
  // 10th frame, so that the probe itself stays cheap.
  let lastReady = -1;
  let frame = 0;
  const poll = () => {
    const expect = window.__vdlBenchExpect || 1;
    const vdl = window.vdl;
    frame++;
    if (vdl) {
      const charts = vdl.charts;
      let ready = 0;
      for (const u of charts.values()) if (hasData(u)) ready++;
      t.charts = ready;
      if (t.all === null && ready >= expect) t.all = performance.now();
      const changed = ready !== lastReady || frame % 10 === 0;
      lastReady = ready;
      if (t.shown === null && ready > 0 && changed && vdl.tags().length >= expect) {
        const H = window.innerHeight;
        let inView = 0, drawn = 0;
        for (const e of document.querySelectorAll("[data-tag]")) {
          const r = e.getBoundingClientRect();
          if (r.bottom <= 0 || r.top >= H) continue;
          inView++;
          if (hasData(charts.get(e.dataset.tag))) drawn++;
        }
        if (inView > 0 && drawn === inView) {
          t.shown = performance.now();
          t.shownCharts = inView;
        }
      }
    }
    if ((t.shown === null || t.all === null) && performance.now() < 30_000) requestAnimationFrame(poll);
  };
  requestAnimationFrame(poll);
})();
