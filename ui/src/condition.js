// Run filter conditions such as `lr < 0.01 and optimizer == "adam"` or `eval/accuracy > 0.9`: a small
// tokenizer and recursive-descent parser into a tree, and an evaluator over one run's fields. Never
// `eval`: a condition can only read the fields a resolver hands it. No DOM.
//
// Grammar (keywords are case-insensitive):
//   condition  := or
//   or         := and ("or" and)*
//   and        := not ("and" not)*
//   not        := "not" not | comparison
//   comparison := operand (("<" | "<=" | ">" | ">=" | "==" | "=" | "!=" | "~") operand)?
//   operand    := number | string | "true" | "false" | "null" | field | "(" or ")"
//   field      := a name of letters, digits and `_ . / : -` (not starting with a digit or `-`),
//                 or any text in backquotes (`my tag`)
// `~` matches a string against a regular expression (case-insensitive). A field a run lacks makes a
// comparison false (and `!=` true). A bare field is true when it is present, non-zero and non-empty.

import { tf } from "./i18n.js";

const KEYWORDS = new Set(["and", "or", "not", "true", "false", "null"]);
const OPERATORS = ["<=", ">=", "==", "!=", "<", ">", "=", "~"];

/**
 * A condition that does not parse, or names a field no run has. The message names the bad text and
 * where it is (1-based, in the language of the page); `key` and `params` give it again for
 * i18n.js (`tf(key, params)`), so a page can show it in another language later; `position` is the
 * 0-based offset.
 */
export class ConditionError extends Error {
  /**
   * @param {string} key the i18n.js key of the message (`cond_*`)
   * @param {Record<string, string|number>} params its parameters
   * @param {number} position character offset in the condition
   */
  constructor(key, params, position) {
    super(tf(key, params));
    this.name = "ConditionError";
    this.key = key;
    this.params = params;
    this.position = position;
  }
}

// The token at `tok` as the condition spells it, quoted, and its 1-based position.
const spelled = (text, tok) => ({ got: JSON.stringify(text.slice(tok.pos, tok.pos + 20).split(/\s/u)[0] || String(tok.value)), at: tok.pos + 1 });

/**
 * Split a condition into tokens: `{kind: "num"|"str"|"field"|"op"|"kw"|"(" |")", value, pos}`.
 * @param {string} text
 * @returns {object[]}
 * @throws {ConditionError} on an unterminated string or a character that starts no token
 */
export function tokenize(text) {
  const tokens = [];
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (/\s/u.test(c)) {
      i++;
      continue;
    }
    const start = i;
    if (c === "(" || c === ")") {
      tokens.push({ kind: c, value: c, pos: start });
      i++;
    } else if (c === '"' || c === "'" || c === "`") {
      let value = "";
      i++;
      while (i < text.length && text[i] !== c) {
        if (text[i] === "\\" && i + 1 < text.length) i++;
        value += text[i++];
      }
      if (i >= text.length) throw new ConditionError(c === "`" ? "cond_unterminated_field" : "cond_unterminated_string", { at: start + 1, text: text.slice(start, start + 20) }, start);
      i++;
      tokens.push({ kind: c === "`" ? "field" : "str", value, pos: start });
    } else if (/[0-9]/u.test(c) || ((c === "-" || c === "+" || c === ".") && /[0-9.]/u.test(text[i + 1] ?? ""))) {
      const m = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?/iu.exec(text.slice(i));
      const value = m ? Number(m[0]) : NaN;
      if (!m || !Number.isFinite(value)) throw new ConditionError("cond_bad_number", { at: start + 1, text: text.slice(start, start + 20) }, start);
      i += m[0].length;
      tokens.push({ kind: "num", value, pos: start });
    } else if (/[\p{L}_]/u.test(c)) {
      const m = /^[\p{L}\p{N}_./:-]+/u.exec(text.slice(i));
      i += m[0].length;
      const lower = m[0].toLowerCase();
      tokens.push(KEYWORDS.has(lower) ? { kind: "kw", value: lower, pos: start } : { kind: "field", value: m[0], pos: start });
    } else {
      const op = OPERATORS.find((o) => text.startsWith(o, i));
      if (!op) throw new ConditionError("cond_unexpected", { got: JSON.stringify(c), at: start + 1 }, start);
      i += op.length;
      tokens.push({ kind: "op", value: op === "=" ? "==" : op, pos: start });
    }
  }
  return tokens;
}

/**
 * Parse a condition into a tree of `{type: "and"|"or", left, right}`, `{type: "not", arg}`,
 * `{type: "cmp", op, left, right}`, `{type: "field", name}` and `{type: "lit", value}` nodes.
 * An empty (or blank) condition parses to null: it keeps every run.
 * @param {string} text
 * @returns {object|null}
 * @throws {ConditionError} with the position and what was expected
 */
export function parseCondition(text) {
  if (typeof text !== "string") throw new TypeError(`condition must be a str, got ${typeof text}`);
  const tokens = tokenize(text);
  if (tokens.length === 0) return null;
  let k = 0;
  const peek = () => tokens[k];
  const isKw = (word) => peek()?.kind === "kw" && peek().value === word;

  function or() {
    let left = and();
    while (isKw("or")) {
      k++;
      left = { type: "or", left, right: and() };
    }
    return left;
  }
  function and() {
    let left = not();
    while (isKw("and")) {
      k++;
      left = { type: "and", left, right: not() };
    }
    return left;
  }
  function not() {
    if (isKw("not")) {
      k++;
      return { type: "not", arg: not() };
    }
    return comparison();
  }
  function comparison() {
    const left = operand();
    if (peek()?.kind !== "op") return left;
    const opTok = tokens[k++];
    const right = operand();
    if (opTok.value === "~") {
      if (right.type !== "lit" || typeof right.value !== "string") throw new ConditionError("cond_regex_operand", spelled(text, tokens[k - 1]), opTok.pos);
      try {
        right.regex = new RegExp(right.value, "iu");
      } catch (err) {
        throw new ConditionError("cond_bad_regex", { regex: JSON.stringify(right.value), at: tokens[k - 1].pos + 1, error: err.message }, tokens[k - 1].pos);
      }
    }
    return { type: "cmp", op: opTok.value, left, right, pos: opTok.pos };
  }
  function operand() {
    const tok = peek();
    if (!tok) throw new ConditionError("cond_expected_end", { text: JSON.stringify(text.trim()) }, text.length);
    if (tok.kind === "(") {
      k++;
      const inner = or();
      if (peek()?.kind !== ")") {
        if (!peek()) throw new ConditionError("cond_unclosed_end", { open: tok.pos + 1 }, text.length);
        throw new ConditionError("cond_unclosed", { open: tok.pos + 1, ...spelled(text, peek()) }, peek().pos);
      }
      k++;
      return inner;
    }
    k++;
    if (tok.kind === "num" || tok.kind === "str") return { type: "lit", value: tok.value };
    if (tok.kind === "field") return { type: "field", name: tok.value, pos: tok.pos };
    if (tok.kind === "kw" && (tok.value === "true" || tok.value === "false")) return { type: "lit", value: tok.value === "true" };
    if (tok.kind === "kw" && tok.value === "null") return { type: "lit", value: null };
    throw new ConditionError("cond_expected", spelled(text, tok), tok.pos);
  }

  const tree = or();
  if (k < tokens.length) {
    const tok = tokens[k];
    const joinable = tok.kind === "field" || tok.kind === "num" || tok.kind === "str";
    throw new ConditionError(joinable ? "cond_unexpected_join" : "cond_unexpected", spelled(text, tok), tok.pos);
  }
  return tree;
}

/**
 * The field names a condition reads.
 * @param {object|null} tree from parseCondition
 * @returns {{name: string, pos: number}[]}
 */
export function conditionFields(tree) {
  const out = [];
  const walk = (node) => {
    if (!node) return;
    if (node.type === "field") out.push({ name: node.name, pos: node.pos });
    for (const key of ["left", "right", "arg"]) if (node[key]) walk(node[key]);
  };
  walk(tree);
  return out;
}

/**
 * Parse a condition and check that every field it names is one of `known` (fields some run has),
 * so a typo is reported rather than silently keeping no run.
 * @param {string} text
 * @param {(name: string) => boolean} known
 * @returns {object|null} the tree
 * @throws {ConditionError}
 */
export function compileCondition(text, known) {
  const tree = parseCondition(text);
  for (const { name, pos } of conditionFields(tree)) {
    if (!known(name)) throw new ConditionError("cond_unknown_field", { name: JSON.stringify(name), at: pos + 1 }, pos);
  }
  return tree;
}

/**
 * Evaluate a parsed condition for one run.
 * @param {object|null} tree from parseCondition (null: true)
 * @param {(name: string) => any} resolve a field's value for this run (undefined: the run lacks it)
 * @returns {boolean}
 */
export function evaluate(tree, resolve) {
  if (tree === null) return true;
  return truthy(value(tree, resolve));
}

function value(node, resolve) {
  switch (node.type) {
    case "lit":
      return node.value;
    case "field":
      return resolve(node.name);
    case "and":
      return truthy(value(node.left, resolve)) && truthy(value(node.right, resolve));
    case "or":
      return truthy(value(node.left, resolve)) || truthy(value(node.right, resolve));
    case "not":
      return !truthy(value(node.arg, resolve));
    case "cmp":
      return compare(node, value(node.left, resolve), value(node.right, resolve));
    default:
      throw new TypeError(`unknown condition node ${node.type}`);
  }
}

function truthy(v) {
  return v !== undefined && v !== null && v !== false && v !== 0 && v !== "" && !Number.isNaN(v);
}

// Numbers (and booleans) compare as numbers, strings as strings; a number given as a string ("0.1"
// in an hparam) compares with a number as that number. A missing side only satisfies `!=`.
function compare(node, a, b) {
  const { op } = node;
  if (op === "~") return a !== undefined && a !== null && node.right.regex.test(String(a));
  const missing = a === undefined || b === undefined;
  if (missing) return op === "!=";
  if (a === null || b === null) return op === "==" ? a === b : op === "!=" ? a !== b : false;
  let x = a;
  let y = b;
  if (typeof x === "boolean") x = Number(x);
  if (typeof y === "boolean") y = Number(y);
  if (typeof x !== typeof y) {
    const nx = Number(x);
    const ny = Number(y);
    if (typeof x === "string" && x.trim() !== "" && Number.isFinite(nx)) x = nx;
    else if (typeof y === "string" && y.trim() !== "" && Number.isFinite(ny)) y = ny;
    else return op === "!=";
  }
  switch (op) {
    case "==":
      return x === y;
    case "!=":
      return x !== y;
    case "<":
      return x < y;
    case "<=":
      return x <= y;
    case ">":
      return x > y;
    case ">=":
      return x >= y;
    default:
      return false;
  }
}
