// The images view: one card per (tag, run) showing one logged image at a time, with a step slider
// that follows the newest image until moved back.
import { colorFor, el } from "../dom.js";
import { t } from "../i18n.js";

// Only raster formats are shown; anything else (e.g. SVG) is not turned into an image.
const MIME = { png: "image/png", jpeg: "image/jpeg", jpg: "image/jpeg", gif: "image/gif", webp: "image/webp" };

export class ImagesView {
  /** @param {object} ctx shared page context: `store`, `scheduler`, `state` */
  constructor(ctx) {
    this.ctx = ctx;
    this.cards = new Map();
    this.empty = el("p", { class: "empty", text: t("noImages") });
    this.grid = el("div", { class: "grid images-grid" });
    this.element = el("div", { class: "view images" }, this.empty, this.grid);
    ctx.store.subscribe((change) => {
      if (change.kind !== "image") return;
      const run = ctx.store.runs.get(change.run);
      if (!run) return;
      for (const tag of run.images.keys()) this._card(tag, change.run);
      for (const card of this.cards.values()) if (card.run === change.run) ctx.scheduler.mark(card);
    });
  }

  /** Apply the run toggles. */
  refresh() {
    for (const card of this.cards.values()) card.element.hidden = this.ctx.state.hiddenRuns.has(card.run);
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.empty.textContent = t("noImages");
    for (const card of this.cards.values()) this.ctx.scheduler.mark(card);
  }

  _card(tag, run) {
    const key = `${tag}\u0000${run}`;
    let card = this.cards.get(key);
    if (card) return card;
    const img = el("img", { class: "media", alt: tag });
    const slider = el("input", { type: "range", min: "0", max: "0", step: "1", value: "0", class: "step-slider", "aria-label": tag });
    const caption = el("div", { class: "readout" });
    const element = el(
      "section",
      { class: "chart image-card", dataset: { imageTag: tag, run } },
      el("header", {}, el("i", { class: "swatch", style: { background: colorFor(run) } }), el("span", { class: "chart-title", text: tag, title: tag }), el("span", { class: "run-label", text: run })),
      el("div", { class: "media-box" }, img),
      slider,
      caption,
    );
    card = { element, run, tag, follow: true, shownKey: null, url: null };
    card.render = () => {
      const list = this.ctx.store.runs.get(run)?.images.get(tag) ?? [];
      const max = Math.max(0, list.length - 1);
      slider.max = String(max);
      if (card.follow) slider.value = String(max);
      const ev = list[Number(slider.value)];
      if (!ev) {
        caption.textContent = "";
        return;
      }
      caption.textContent = `${t("step")} ${ev.step} · ${Number(slider.value) + 1}/${list.length}${ev.width && ev.height ? ` · ${ev.width}×${ev.height}` : ""}`;
      const shownKey = `${ev.step}:${ev.wall}`;
      if (shownKey === card.shownKey) return;
      card.shownKey = shownKey;
      if (card.url) URL.revokeObjectURL(card.url);
      card.url = null;
      const mime = MIME[String(ev.format).toLowerCase()];
      if (!mime || !(ev.data instanceof Uint8Array)) {
        img.removeAttribute("src");
        return;
      }
      card.url = URL.createObjectURL(new Blob([ev.data], { type: mime }));
      img.src = card.url;
    };
    slider.addEventListener("input", () => {
      card.follow = Number(slider.value) >= Number(slider.max);
      card.render();
    });
    this.cards.set(key, card);
    const keys = [...this.cards.keys()].sort();
    const next = keys[keys.indexOf(key) + 1];
    this.grid.insertBefore(element, next === undefined ? null : this.cards.get(next).element);
    element.hidden = this.ctx.state.hiddenRuns.has(run);
    this.ctx.scheduler.observe(card);
    this.empty.hidden = true;
    return card;
  }
}
