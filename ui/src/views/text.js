// The text view: one card per (tag, run) listing logged text, newest first. Text and tags are only
// ever set as textContent, so markup in them is shown, never run.
import { colorFor, el, insertSorted } from "../dom.js";
import { t } from "../i18n.js";

/** Most entries listed per card. */
const SHOWN = 100;

export class TextView {
  /** @param {object} ctx shared page context: `store`, `scheduler`, `state` */
  constructor(ctx) {
    this.ctx = ctx;
    this.cards = new Map();
    this.empty = el("p", { class: "empty", text: t("noText") });
    this.list = el("div", { class: "text-list" });
    this.element = el("div", { class: "view text" }, this.empty, this.list);
    ctx.store.subscribe((change) => {
      if (change.kind !== "text") return;
      const run = ctx.store.runs.get(change.run);
      if (!run) return;
      for (const tag of run.texts.keys()) this._card(tag, change.run);
      for (const card of this.cards.values()) if (card.run === change.run) ctx.scheduler.mark(card);
    }, { current: true });
  }

  /** Apply the run toggles and the tag filter. */
  refresh() {
    for (const card of this.cards.values()) card.element.hidden = !this.ctx.shown(card.run, card.tag);
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.empty.textContent = t("noText");
    for (const card of this.cards.values()) this.ctx.scheduler.mark(card);
  }

  _card(tag, run) {
    const key = `${tag}\u0000${run}`;
    let card = this.cards.get(key);
    if (card) return card;
    const entries = el("ol", { class: "entries", reversed: true });
    const element = el(
      "section",
      { class: "chart text-card", dataset: { textTag: tag, run } },
      el("header", {}, el("i", { class: "swatch", style: { background: colorFor(run) } }), el("span", { class: "chart-title", text: tag, title: tag }), el("span", { class: "run-label", text: run })),
      entries,
    );
    card = {
      element,
      run,
      tag,
      render: () => {
        const list = this.ctx.store.runs.get(run)?.texts.get(tag) ?? [];
        entries.replaceChildren(
          ...list
            .slice(-SHOWN)
            .reverse()
            .map((ev) => el("li", {}, el("span", { class: "entry-step", text: `${t("step")} ${ev.step}` }), el("pre", { class: "entry-text", text: String(ev.text ?? "") }))),
        );
      },
    };
    this.cards.set(key, card);
    insertSorted(this.list, this.cards, key, element);
    element.hidden = !this.ctx.shown(run, tag);
    this.ctx.scheduler.observe(card);
    this.empty.hidden = true;
    return card;
  }
}
