import assert from "node:assert/strict";
import { test } from "node:test";
import { loadingText, setLanguage, t, tf } from "../src/i18n.js";

test("tf fills {names} and leaves unknown ones", () => {
  assert.equal(tf("loadingRuns", { total: 3, done: 1 }), "Loading 3 runs… (1/3)");
  assert.equal(tf("loadingRuns", { total: 3 }), "Loading 3 runs… ({done}/3)");
});

test("the empty page says connecting, then loading with progress, and 'No data yet' only when ready", () => {
  setLanguage("en");
  assert.equal(loadingText({ phase: "connecting", total: 0, done: 0 }), t("connecting"));
  assert.equal(loadingText({ phase: "loading", total: 3, done: 2 }), "Loading 3 runs… (2/3)");
  assert.equal(loadingText({ phase: "loading", total: 1, done: 0 }), "Loading 1 run… (0/1)");
  assert.match(loadingText({ phase: "ready", total: 3, done: 3 }), /^No data yet/);
  setLanguage("zh");
  try {
    assert.equal(loadingText({ phase: "loading", total: 3, done: 2 }), "正在加载 3 个运行…（2/3）");
    assert.match(loadingText({ phase: "ready", total: 0, done: 0 }), /^暂无数据/);
  } finally {
    setLanguage("en");
  }
});
