// Interface strings in English and Chinese. The language follows navigator.language until the user
// picks one with the switch; the choice is kept in localStorage.

const STRINGS = {
  en: {
    title: "vdl-stream",
    connecting: "Connecting…",
    connected: "Live",
    disconnected: "Disconnected — retrying",
    pause: "Pause",
    resume: "Resume",
    paused: "Paused",
    scalars: "Scalars",
    histograms: "Histograms",
    system: "System",
    images: "Images & audio",
    text: "Text",
    runs: "Runs",
    tagFilter: "Filter tags (regex)",
    badRegex: "Invalid regular expression",
    smoothing: "Smoothing",
    xAxis: "X axis",
    xStep: "Step",
    xRelative: "Relative",
    xWall: "Wall time",
    logY: "Log y",
    reset: "Reset zoom",
    savePng: "PNG",
    noData: "No data yet. Log something with vdl_stream.attach() and it appears here.",
    loadingRuns: "Loading {total} runs… ({done}/{total})",
    loadingRun: "Loading 1 run… ({done}/1)",
    loadingShort: "Loading {done}/{total}",
    noTags: "No tags match the filter.",
    step: "step",
    pinned: "pinned — click to release",
    language: "Language",
    ridgeline: "Ridgeline",
    heatmap: "Heatmap",
    gpuUtil: "GPU utilization (%)",
    gpuMem: "GPU memory used",
    gpuTemp: "GPU temperature (°C)",
    gpuPower: "GPU power (W)",
    cpuPercent: "CPU (%)",
    ramUsed: "RAM used",
    noSystem: "No telemetry yet.",
    noHist: "No histograms yet.",
    noImages: "No images or audio yet.",
    noText: "No text yet.",
    all: "All",
    none: "None",
    frames: "frames",
    more: "More",
    curves: "PR / ROC",
    noCurves: "No PR or ROC curves yet.",
    hparams: "Hyperparameters",
    noHparams: "No hyperparameters yet.",
    run: "Run",
    replay: "Replay",
    replayPlay: "Play",
    replayPause: "Pause",
    replayAgain: "Replay again",
    replaySpeed: "Replay speed",
    replayMax: "max",
    replayPosition: "Replay position",
  },
  zh: {
    title: "vdl-stream",
    connecting: "正在连接…",
    connected: "实时",
    disconnected: "连接断开，正在重试",
    pause: "暂停",
    resume: "继续",
    paused: "已暂停",
    scalars: "标量",
    histograms: "直方图",
    system: "系统",
    images: "图像与音频",
    text: "文本",
    runs: "运行",
    tagFilter: "筛选标签（正则表达式）",
    badRegex: "正则表达式无效",
    smoothing: "平滑",
    xAxis: "横轴",
    xStep: "步数",
    xRelative: "相对时间",
    xWall: "时间",
    logY: "对数纵轴",
    reset: "重置缩放",
    savePng: "PNG",
    noData: "暂无数据。用 vdl_stream.attach() 记录后会显示在这里。",
    loadingRuns: "正在加载 {total} 个运行…（{done}/{total}）",
    loadingRun: "正在加载 1 个运行…（{done}/1）",
    loadingShort: "加载中 {done}/{total}",
    noTags: "没有匹配筛选条件的标签。",
    step: "步",
    pinned: "已固定，点击取消",
    language: "语言",
    ridgeline: "山脊图",
    heatmap: "热力图",
    gpuUtil: "GPU 利用率（%）",
    gpuMem: "GPU 显存占用",
    gpuTemp: "GPU 温度（°C）",
    gpuPower: "GPU 功率（W）",
    cpuPercent: "CPU（%）",
    ramUsed: "内存占用",
    noSystem: "暂无系统数据。",
    noHist: "暂无直方图。",
    noImages: "暂无图像或音频。",
    noText: "暂无文本。",
    all: "全部",
    none: "无",
    frames: "帧",
    more: "更多",
    curves: "PR / ROC 曲线",
    noCurves: "暂无 PR 或 ROC 曲线。",
    hparams: "超参数",
    noHparams: "暂无超参数。",
    run: "运行",
    replay: "回放",
    replayPlay: "播放",
    replayPause: "暂停",
    replayAgain: "重新回放",
    replaySpeed: "回放速度",
    replayMax: "最快",
    replayPosition: "回放位置",
  },
};

// Alerts panel, toasts and chart markers (ui/src/views/alerts.js, ui/src/toast.js; issue 14).
Object.assign(STRINGS.en, {
  alerts: "Alerts",
  noAlerts: "No alerts.",
  alertsOpen: "{open} open of {total}",
  alertAck: "Acknowledge",
  alertUnack: "Reopen",
  alertMute: "Mute",
  alertUnmute: "Unmute",
  alertMuteHint: "No more toasts or chart markers for this rule on this tag of this run",
  close: "Close",
  level_info: "Info",
  level_warn: "Warning",
  level_error: "Error",
  alert_nan: "NaN or Inf",
  alert_spike: "Spike",
  alert_divergence: "Diverging",
  alert_plateau: "Plateau",
  alert_stall: "Run stalled",
  alert_crash: "Run crashed",
  alert_gpu_underuse: "GPU underused",
  alert_gpu_memory: "GPU memory nearly full",
  alert_gradient_explode: "Exploding gradients",
  alert_gradient_vanish: "Vanishing gradients",
});
Object.assign(STRINGS.zh, {
  alerts: "告警",
  noAlerts: "暂无告警。",
  alertsOpen: "未处理 {open} / 共 {total}",
  alertAck: "确认",
  alertUnack: "重新打开",
  alertMute: "静音",
  alertUnmute: "取消静音",
  alertMuteHint: "此运行中该标签的这条规则不再弹出提示，也不在图表上标记",
  close: "关闭",
  level_info: "提示",
  level_warn: "警告",
  level_error: "错误",
  alert_nan: "出现 NaN 或 Inf",
  alert_spike: "突刺",
  alert_divergence: "发散",
  alert_plateau: "停滞不降",
  alert_stall: "运行停滞",
  alert_crash: "运行崩溃",
  alert_gpu_underuse: "GPU 利用率低",
  alert_gpu_memory: "GPU 显存将满",
  alert_gradient_explode: "梯度爆炸",
  alert_gradient_vanish: "梯度消失",
});

/** Supported language codes. */
export const LANGUAGES = Object.keys(STRINGS);

const LANG_KEY = "vdl-stream.lang";
let current = "en";
const listeners = new Set();

/**
 * The language for a browser language list: `zh*` gives Chinese, anything else English.
 * @param {readonly string[]} languages e.g. navigator.languages
 */
export function pickLanguage(languages) {
  for (const lang of languages ?? []) {
    const code = String(lang).toLowerCase().split("-")[0];
    if (code in STRINGS) return code;
  }
  return "en";
}

/** Set the language from storage or the browser; call once at start-up. */
export function initLanguage() {
  let saved = null;
  try {
    saved = localStorage.getItem(LANG_KEY);
  } catch {
    // ignore: storage disabled
  }
  current = saved in STRINGS ? saved : pickLanguage(navigator.languages?.length ? navigator.languages : [navigator.language]);
  document.documentElement.lang = current === "zh" ? "zh-CN" : "en";
}

/** The current language code. */
export function language() {
  return current;
}

/**
 * Switch language, remember it, and notify listeners.
 * @param {string} code one of LANGUAGES
 */
export function setLanguage(code) {
  if (!(code in STRINGS)) throw new RangeError(`language must be one of ${LANGUAGES.join(", ")}, got ${code}`);
  current = code;
  try {
    localStorage.setItem(LANG_KEY, code);
  } catch {
    // ignore
  }
  if (typeof document !== "undefined") document.documentElement.lang = code === "zh" ? "zh-CN" : "en";
  for (const fn of listeners) fn(code);
}

/** Call `fn` after each language change. */
export function onLanguage(fn) {
  listeners.add(fn);
}

/** The string for `key` in the current language (the key itself when missing). */
export function t(key) {
  return STRINGS[current][key] ?? STRINGS.en[key] ?? key;
}

/**
 * The string for `key` with each `{name}` replaced by `params[name]` (left as is when missing).
 * @param {string} key
 * @param {Record<string, string|number>} params
 */
export function tf(key, params) {
  return t(key).replace(/\{(\w+)\}/g, (whole, name) => (name in params ? String(params[name]) : whole));
}

/**
 * What the page says while it has no charts to show, for a store's `syncState()`: connecting,
 * "Loading N runs… (done/N)", or (only once every snapshot is in) "No data yet".
 * @param {{phase: string, total: number, done: number}} sync
 */
export function loadingText(sync) {
  if (sync.phase === "ready") return t("noData");
  if (sync.phase === "loading") return tf(sync.total === 1 ? "loadingRun" : "loadingRuns", sync);
  return t("connecting");
}
