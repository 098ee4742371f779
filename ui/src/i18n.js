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
    loadingView: "Loading this view…",
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
    videoFrames: "{frames} frames at {fps} fps",
    noText: "No text yet.",
    all: "All",
    none: "None",
    frames: "frames",
    more: "More",
    curves: "PR / ROC",
    noCurves: "No PR or ROC curves yet.",
    hparams: "Hyperparameters",
    noHparams: "No hyperparameters yet.",
    // -- runs table, groups, hparam views (issue 12) --
    runSearch: "Search runs",
    runCondition: "Condition, e.g. lr < 0.01 and optimizer == \"adam\"",
    runConditionHelp: "Fields: name, status, start, duration, step, host, any hparam, any scalar tag (its last value), tag.min, tag.max; operators < <= > >= == != ~ (regex), and, or, not",
    groupPattern: "Name pattern (regex)",
    badGroupPattern: "Invalid pattern: {error}",
    noGroups: "No groups",
    groupByPattern: "Group by name pattern",
    // issue 12: the band around a group's mean
    bandMinMax: "Band: min–max",
    bandStd: "Band: ±1 std",
    groupBand: "Band drawn around each group's mean",
    mean: "mean",
    bandMinMaxShort: "min – max",
    bandStdShort: "± std",
    runsShort: "runs",
    groupByHparam: "Group by {name}",
    showHidden: "Show hidden",
    metricColumns: "Metric columns",
    widenRuns: "Widen the runs table",
    runsCount: "{shown}/{total}",
    col_name: "Run",
    col_status: "Status",
    col_start: "Start",
    col_duration: "Duration",
    col_last_step: "Step",
    col_host: "Host",
    agg_last: "last",
    agg_min: "min",
    agg_max: "max",
    status_live: "live",
    status_finished: "finished",
    status_crashed: "crashed",
    pinRun: "Pin to the top",
    unpinRun: "Unpin",
    hideRun: "Hide",
    unhideRun: "Show",
    parallel: "Parallel coordinates",
    parallelHelp: "Drag along an axis to keep only the runs in that range; click an axis to clear it.",
    scatter: "Metric vs hyperparameter",
    heatmapTitle: "Metric over two hyperparameters",
    metric: "Metric",
    hparamX: "x",
    hparamY: "y",
    noRunsWithHparams: "No runs with hyperparameters and metrics yet.",
    groupMean: "{name} (mean of {n})",
    hparamsMore: "The first {shown} of {total} runs (the runs table lists them all).",
    cond_unterminated_string: "unterminated string starting at {at}: {text}",
    cond_unterminated_field: "unterminated field name starting at {at}: {text}",
    cond_bad_number: "bad number at {at}: {text}",
    cond_unexpected: "unexpected {got} at {at}",
    cond_unexpected_join: "unexpected {got} at {at} (missing `and` / `or`?)",
    cond_regex_operand: "~ needs a quoted regular expression after it, got {got} at {at}",
    cond_bad_regex: "bad regular expression {regex} at {at}: {error}",
    cond_expected_end: "expected a field, number or string at the end of {text}",
    cond_expected: "expected a field, number or string, got {got} at {at}",
    cond_unclosed: "expected \")\" to close the \"(\" at {open}, got {got} at {at}",
    cond_unclosed_end: "expected \")\" to close the \"(\" at {open}, got the end",
    cond_unknown_field: "unknown field {name} at {at}: no run has it",
    run: "Run",
    replay: "Replay",
    replayPlay: "Play",
    replayPause: "Pause",
    replayAgain: "Replay again",
    replaySpeed: "Replay speed",
    replayMax: "max",
    replayPosition: "Replay position",
    // chart tools, badges, curves, histograms and the report (issue 12, items 5-7)
    yRange: "Y range and outliers",
    yMin: "y min",
    yMax: "y max",
    auto: "auto",
    ignoreOutliers: "Ignore outliers (1st–99th percentile)",
    offScale: "↕ {n} off scale",
    offScaleRuns: "Left out of the y range (far off the other lines): {runs}.",
    offScaleShow: "Click to show the full range.",
    offScaleClip: "Showing the full range; click to leave them out again.",
    badBound: "Not a valid range",
    saveCsv: "Download data as CSV",
    saveJson: "Download data as JSON",
    fullscreen: "Fullscreen (Esc to leave)",
    smoothed: "smoothed",
    raw: "raw",
    axisRelative: "Relative time",
    badgeLive: "Live",
    badgePaused: "Paused",
    badgeReplay: "Replay",
    badgeReplayPaused: "Replay · paused",
    goToView: "Go to {view}",
    recall: "Recall",
    precision: "Precision",
    fpr: "False positive rate",
    tpr: "True positive rate",
    chance: "chance",
    auc: "AUC",
    moreRows: "+{n} more",
    countScale: "count ÷ step max",
    badRegexAt: "Invalid regular expression: {message}",
    exportReport: "Export report",
    reportTitle: "vdl-stream report",
    reportViews: "Views in the report",
    reportPdf: "PDF (print)",
    reportPng: "PNG",
    reportClose: "Close",
    reportExported: "Exported {time}",
    reportSmoothing: "smoothing {w}",
    reportXAxis: "x axis: {x}",
    reportEmpty: "Nothing to export in the chosen views.",
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
    loadingView: "正在加载此视图…",
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
    videoFrames: "{frames} 帧，每秒 {fps} 帧",
    noText: "暂无文本。",
    all: "全部",
    none: "无",
    frames: "帧",
    more: "更多",
    curves: "PR / ROC 曲线",
    noCurves: "暂无 PR 或 ROC 曲线。",
    hparams: "超参数",
    noHparams: "暂无超参数。",
    // -- runs table, groups, hparam views (issue 12) --
    runSearch: "搜索运行",
    runCondition: "条件，例如 lr < 0.01 and optimizer == \"adam\"",
    runConditionHelp: "字段：name、status、start、duration、step、host、任一超参数、任一标量标签（最新值）、tag.min、tag.max；运算符 < <= > >= == != ~（正则）、and、or、not",
    groupPattern: "名称模式（正则）",
    badGroupPattern: "无效的模式：{error}",
    noGroups: "不分组",
    groupByPattern: "按名称模式分组",
    bandMinMax: "区间：最小–最大",
    bandStd: "区间：±1 标准差",
    groupBand: "每组均值周围的区间",
    mean: "均值",
    bandMinMaxShort: "最小 – 最大",
    bandStdShort: "± 标准差",
    runsShort: "运行数",
    groupByHparam: "按 {name} 分组",
    showHidden: "显示已隐藏",
    metricColumns: "指标列",
    widenRuns: "加宽运行表",
    runsCount: "{shown}/{total}",
    col_name: "运行",
    col_status: "状态",
    col_start: "开始",
    col_duration: "时长",
    col_last_step: "步数",
    col_host: "主机",
    agg_last: "最新",
    agg_min: "最小",
    agg_max: "最大",
    status_live: "运行中",
    status_finished: "已结束",
    status_crashed: "已中断",
    pinRun: "置顶",
    unpinRun: "取消置顶",
    hideRun: "隐藏",
    unhideRun: "显示",
    parallel: "平行坐标",
    parallelHelp: "沿坐标轴拖动只保留该范围内的运行；点击坐标轴清除。",
    scatter: "指标与超参数",
    heatmapTitle: "指标随两个超参数的热力图",
    metric: "指标",
    hparamX: "x",
    hparamY: "y",
    noRunsWithHparams: "暂无带超参数和指标的运行。",
    groupMean: "{name}（{n} 个的均值）",
    hparamsMore: "共 {total} 个运行，显示前 {shown} 个（运行表列出全部）。",
    cond_unterminated_string: "字符串未结束（从第 {at} 个字符开始）：{text}",
    cond_unterminated_field: "字段名未结束（从第 {at} 个字符开始）：{text}",
    cond_bad_number: "第 {at} 个字符处的数字无效：{text}",
    cond_unexpected: "第 {at} 个字符处出现意外的 {got}",
    cond_unexpected_join: "第 {at} 个字符处出现意外的 {got}（缺少 and / or？）",
    cond_regex_operand: "~ 之后需要带引号的正则表达式，第 {at} 个字符处却是 {got}",
    cond_bad_regex: "第 {at} 个字符处的正则表达式 {regex} 无效：{error}",
    cond_expected_end: "{text} 的末尾缺少字段、数字或字符串",
    cond_expected: "第 {at} 个字符处应为字段、数字或字符串，却是 {got}",
    cond_unclosed: "第 {open} 个字符处的 \"(\" 缺少 \")\"，第 {at} 个字符处却是 {got}",
    cond_unclosed_end: "第 {open} 个字符处的 \"(\" 缺少 \")\"",
    cond_unknown_field: "第 {at} 个字符处的字段 {name} 未知：没有运行含有它",
    run: "运行",
    replay: "回放",
    replayPlay: "播放",
    replayPause: "暂停",
    replayAgain: "重新回放",
    replaySpeed: "回放速度",
    replayMax: "最快",
    replayPosition: "回放位置",
    // 图表工具、状态标记、曲线、直方图与报告（issue 12 第 5-7 项）
    yRange: "纵轴范围与离群值",
    yMin: "纵轴最小",
    yMax: "纵轴最大",
    auto: "自动",
    ignoreOutliers: "忽略离群值（第 1–99 百分位）",
    offScale: "↕ {n} 条超出范围",
    offScaleRuns: "未计入 y 轴范围（远离其他曲线）：{runs}。",
    offScaleShow: "点击显示完整范围。",
    offScaleClip: "正在显示完整范围；点击再次排除它们。",
    badBound: "范围无效",
    saveCsv: "下载数据（CSV）",
    saveJson: "下载数据（JSON）",
    fullscreen: "全屏（按 Esc 退出）",
    smoothed: "平滑值",
    raw: "原始值",
    axisRelative: "相对时间",
    badgeLive: "实时",
    badgePaused: "已暂停",
    badgeReplay: "回放",
    badgeReplayPaused: "回放 · 已暂停",
    goToView: "跳转到{view}",
    recall: "召回率",
    precision: "精确率",
    fpr: "假正例率",
    tpr: "真正例率",
    chance: "随机",
    auc: "AUC",
    moreRows: "另有 {n} 个",
    countScale: "计数 ÷ 该步最大值",
    badRegexAt: "正则表达式无效：{message}",
    exportReport: "导出报告",
    reportTitle: "vdl-stream 报告",
    reportViews: "报告包含的视图",
    reportPdf: "PDF（打印）",
    reportPng: "PNG",
    reportClose: "关闭",
    reportExported: "导出时间 {time}",
    reportSmoothing: "平滑 {w}",
    reportXAxis: "横轴：{x}",
    reportEmpty: "所选视图中没有可导出的内容。",
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
  alert_writers: "Two writers",
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
  alert_writers: "两个写入者",
  alert_gpu_underuse: "GPU 利用率低",
  alert_gpu_memory: "GPU 显存将满",
  alert_gradient_explode: "梯度爆炸",
  alert_gradient_vanish: "梯度消失",
});

// Model graph view (ui/src/views/graph.js; issue 15).
Object.assign(STRINGS.en, {
  graph: "Graph",
  noGraph: "No model graph yet. Log one with writer.add_graph(model, input).",
  graphSearch: "Search ops (name or type), Enter jumps",
  graphExpandAll: "Expand all",
  graphCollapseAll: "Collapse all",
  graphFit: "Fit",
  graphSummary: "{framework} · {nodes} ops · {edges} edges · {params} parameters",
  graphScopeOps: "{count} ops, {op}…",
  graphFound: "{at}/{count}",
  graphScope: "Scope",
  graphOps: "Ops",
  graphParams: "Parameters",
  graphClickOpen: "Click to expand",
  graphOp: "Op",
  graphName: "Name",
  graphInputs: "Inputs",
  graphOutputs: "Outputs",
});
Object.assign(STRINGS.zh, {
  graph: "模型结构",
  noGraph: "暂无模型结构图。用 writer.add_graph(model, input) 记录一个。",
  graphSearch: "搜索算子（名称或类型），回车跳转",
  graphExpandAll: "全部展开",
  graphCollapseAll: "全部折叠",
  graphFit: "适应窗口",
  graphSummary: "{framework} · {nodes} 个算子 · {edges} 条边 · {params} 个参数",
  graphScopeOps: "{count} 个算子，{op}…",
  graphFound: "{at}/{count}",
  graphScope: "作用域",
  graphOps: "算子",
  graphParams: "参数量",
  graphClickOpen: "点击展开",
  graphOp: "算子",
  graphName: "名称",
  graphInputs: "输入",
  graphOutputs: "输出",
});
// Embeddings projector (ui/src/views/embeddings.js; issue 15).
Object.assign(STRINGS.en, {
  embeddings: "Embeddings",
  noEmbeddings: "No embeddings yet. Log one with writer.add_embedding(mat, metadata, label_img).",
  embedSource: "Embedding",
  embedMethod: "Projection",
  methodPca: "PCA",
  methodUmap: "UMAP (non-linear)",
  embedColor: "Colour by",
  embedNoColor: "— none —",
  embedSearch: "Search labels",
  embedMatches: "{n} matches",
  embedLoading: "Loading {n} × {d}…",
  embedPca: "PCA of {n} × {d}: {x}% + {y}% of the variance",
  embedGraph: "UMAP: finding each point's neighbours…",
  embedLayout: "UMAP: epoch {epoch} of {epochs}",
  embedDone: "UMAP of {n} points ({s} s)",
  embedError: "Could not show the embedding: {message}",
  embedOther: "other",
  embedHint: "Drag to pan, wheel to zoom, double-click to fit.",
  embedPoint: "point {i}",
});
Object.assign(STRINGS.zh, {
  embeddings: "高维嵌入",
  noEmbeddings: "暂无嵌入向量。用 writer.add_embedding(mat, metadata, label_img) 记录。",
  embedSource: "嵌入",
  embedMethod: "投影方法",
  methodPca: "PCA（主成分分析）",
  methodUmap: "UMAP（非线性）",
  embedColor: "着色依据",
  embedNoColor: "— 无 —",
  embedSearch: "搜索标签",
  embedMatches: "{n} 个匹配",
  embedLoading: "正在加载 {n} × {d}…",
  embedPca: "{n} × {d} 的 PCA：解释 {x}% + {y}% 的方差",
  embedGraph: "UMAP：正在查找每个点的近邻…",
  embedLayout: "UMAP：第 {epoch}/{epochs} 轮",
  embedDone: "{n} 个点的 UMAP（{s} 秒）",
  embedError: "无法显示该嵌入：{message}",
  embedOther: "其他",
  embedHint: "拖动平移，滚轮缩放，双击适配全部点。",
  embedPoint: "第 {i} 个点",
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
