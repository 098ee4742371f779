import assert from "node:assert/strict";
import { test } from "node:test";
import { ConditionError, compileCondition, conditionFields, evaluate, parseCondition, tokenize } from "../src/condition.js";

const run = (fields) => (name) => fields[name];
const holds = (text, fields) => evaluate(parseCondition(text), run(fields));

test("comparisons of numbers and strings, joined by and / or / not", () => {
  const adam = { lr: 0.005, optimizer: "adam", "eval/accuracy": 0.93 };
  const sgd = { lr: 0.1, optimizer: "sgd", "eval/accuracy": 0.95 };
  const text = 'lr < 0.01 and optimizer == "adam"';
  assert.equal(holds(text, adam), true);
  assert.equal(holds(text, sgd), false);
  assert.equal(holds("eval/accuracy > 0.9", sgd), true);
  assert.equal(holds("eval/accuracy >= 0.95 or lr <= 0.005", adam), true);
  assert.equal(holds("not optimizer == 'sgd'", adam), true);
  assert.equal(holds("NOT (lr > 0.01 OR optimizer = 'adam')", adam), false);
  assert.equal(holds("lr != 0.1", sgd), false);
  assert.equal(holds("-1e-3 < lr", adam), true);
});

test("and binds tighter than or", () => {
  // a or (b and c), not (a or b) and c
  assert.equal(holds("x == 1 or x == 2 and y == 3", { x: 1, y: 0 }), true);
  assert.equal(holds("(x == 1 or x == 2) and y == 3", { x: 1, y: 0 }), false);
});

test("a field the run lacks makes comparisons false, except !=", () => {
  assert.equal(holds("lr < 1", {}), false);
  assert.equal(holds("lr > 1", {}), false);
  assert.equal(holds("lr != 1", {}), true);
  assert.equal(holds("lr", {}), false);
  assert.equal(holds("lr", { lr: 0.1 }), true);
});

test("numbers logged as strings compare as numbers; booleans as 0 / 1", () => {
  assert.equal(holds("lr < 0.01", { lr: "0.001" }), true);
  assert.equal(holds("bn == true", { bn: true }), true);
  assert.equal(holds("bn == 1", { bn: true }), true);
  assert.equal(holds('name == 3', { name: "abc" }), false);
  assert.equal(holds('name != 3', { name: "abc" }), true);
});

test("~ matches a regular expression, case-insensitively", () => {
  assert.equal(holds('name ~ "seed[12]$"', { name: "lr0.1-SEED2" }), true);
  assert.equal(holds('name ~ "seed[12]$"', { name: "lr0.1-seed3" }), false);
});

test("field names: tags with slashes, dots, dashes; anything in backquotes", () => {
  assert.deepEqual(
    conditionFields(parseCondition("train/loss.min < 1 and `my tag (x)` > 2 and a-b == 1")).map((f) => f.name),
    ["train/loss.min", "my tag (x)", "a-b"],
  );
  assert.equal(holds("`my tag (x)` > 2", { "my tag (x)": 3 }), true);
});

test("an empty condition keeps every run", () => {
  assert.equal(parseCondition("   "), null);
  assert.equal(evaluate(null, run({})), true);
});

test("errors name what is wrong and where", () => {
  const cases = [
    ["lr <", /expected a field, number or string at the end of "lr <"/],
    ["lr < 0.01 and", /expected a field, number or string at the end/],
    ['optimizer == "adam', /unterminated string starting at 14/],
    ["lr < 0.01 optimizer", /unexpected "optimizer" at 11 \(missing `and` \/ `or`\?\)/],
    ["(lr < 1", /expected "\)" to close the "\(" at 1, got the end/],
    ["lr # 1", /unexpected "#" at 4/],
    ["lr < and", /expected a field, number or string, got "and" at 6/],
    ['name ~ "("', /bad regular expression "\(" at 8/],
    ["name ~ abc", /~ needs a quoted regular expression/],
  ];
  for (const [text, message] of cases) {
    assert.throws(() => parseCondition(text), (err) => err instanceof ConditionError && message.test(err.message), text);
  }
  const err = (() => {
    try {
      parseCondition("lr < 0.01 optimizer");
    } catch (e) {
      return e;
    }
  })();
  assert.equal(err.position, 10);
});

test("compileCondition refuses a field no run has", () => {
  const known = (name) => ["lr", "optimizer"].includes(name);
  assert.ok(compileCondition("lr < 1", known));
  assert.throws(() => compileCondition("lr < 1 and lrr > 2", known), /unknown field "lrr" at 12: no run has it/);
});

test("tokenize never evaluates code", () => {
  globalThis.__touched = false;
  assert.throws(() => parseCondition("globalThis.__touched = true; 1"), ConditionError);
  const tree = parseCondition("constructor == 1 or __proto__ == 1");
  // Fields are only read through the resolver: an empty run has neither.
  assert.equal(evaluate(tree, (name) => Object.hasOwn({}, name) ? {}[name] : undefined), false);
  assert.equal(globalThis.__touched, false);
  assert.equal(tokenize("a<=1").map((t) => t.value).join(" "), "a <= 1");
});

test("errors carry an i18n key and parameters, and read in Chinese too", async () => {
  const { setLanguage, tf } = await import("../src/i18n.js");
  let err;
  try {
    parseCondition("lr < 0.01 optimizer");
  } catch (e) {
    err = e;
  }
  assert.equal(err.key, "cond_unexpected_join");
  assert.deepEqual(err.params, { got: '"optimizer"', at: 11 });
  setLanguage("zh");
  try {
    assert.equal(tf(err.key, err.params), '第 11 个字符处出现意外的 "optimizer"（缺少 and / or？）');
    assert.throws(() => parseCondition("(lr < 1"), /第 1 个字符处的 "\(" 缺少 "\)"/);
  } finally {
    setLanguage("en");
  }
  assert.throws(() => parseCondition(3), /condition must be a str, got number/);
});
