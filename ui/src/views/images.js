// The images view: one card per (tag, run) showing one logged image (or audio clip) at a time,
// with a step slider that follows the newest one until moved back.
import { colorFor, el, insertSorted } from "../dom.js";
import { t, tf } from "../i18n.js";

// Only raster formats are shown; anything else (e.g. SVG) is not turned into an image.
const MIME = { png: "image/png", jpeg: "image/jpeg", jpg: "image/jpeg", gif: "image/gif", webp: "image/webp", wav: "audio/wav" };

// Per kind: the store's list and the card's data attribute.
const KINDS = {
  image: { list: "images", attr: "imageTag" },
  audio: { list: "audio", attr: "audioTag" },
};

export class ImagesView {
  /** @param {object} ctx shared page context: `store`, `scheduler`, `state` */
  constructor(ctx) {
    this.ctx = ctx;
    this.cards = new Map();
    this.empty = el("p", { class: "empty", text: t("noImages") });
    this.grid = el("div", { class: "grid images-grid" });
    this.element = el("div", { class: "view images" }, this.empty, this.grid);
    ctx.store.subscribe((change) => {
      if (!(change.kind in KINDS)) return;
      const run = ctx.store.runs.get(change.run);
      if (!run) return;
      for (const tag of run[KINDS[change.kind].list].keys()) this._card(change.kind, tag, change.run);
      for (const card of this.cards.values()) if (card.run === change.run) ctx.scheduler.mark(card);
    }, { current: true });
  }

  /** Apply the run toggles and the tag filter. */
  refresh() {
    for (const card of this.cards.values()) card.element.hidden = !this.ctx.shown(card.run, card.tag);
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.empty.textContent = t("noImages");
    for (const card of this.cards.values()) this.ctx.scheduler.mark(card);
  }

  _card(kind, tag, run) {
    const key = `${kind}\u0000${tag}\u0000${run}`;
    let card = this.cards.get(key);
    if (card) return card;
    const spec = KINDS[kind];
    const img = kind === "audio" ? el("audio", { class: "media", controls: true, preload: "none" }) : el("img", { class: "media", alt: tag });
    const slider = el("input", { type: "range", min: "0", max: "0", step: "1", value: "0", class: "step-slider", "aria-label": tag });
    const caption = el("div", { class: "readout" });
    const element = el(
      "section",
      { class: `chart ${kind}-card`, dataset: { [spec.attr]: tag, run } },
      el("header", {}, el("i", { class: "swatch", style: { background: colorFor(run) } }), el("span", { class: "chart-title", text: tag, title: tag }), el("span", { class: "run-label", text: run })),
      el("div", { class: "media-box" }, img),
      slider,
      caption,
    );
    card = { element, run, tag, follow: true, shownKey: null, url: null };
    card.render = () => {
      const list = this.ctx.store.runs.get(run)?.[spec.list].get(tag) ?? [];
      const max = Math.max(0, list.length - 1);
      slider.max = String(max);
      slider.disabled = max === 0;
      if (card.follow) slider.value = String(max);
      const ev = list[Number(slider.value)];
      if (!ev) {
        caption.textContent = "";
        return;
      }
      const size =
        kind === "audio" ? (ev.frames && ev.sample_rate ? ` · ${(ev.frames / ev.sample_rate).toFixed(2)} s` : "")
        : ev.width && ev.height ? ` · ${ev.width}×${ev.height}` : "";
      // A video (add_video) is an animated GIF: the <img> plays it; the caption says how long it is.
      const video = ev.frames > 1 && ev.fps > 0 ? ` · ${tf("videoFrames", { frames: ev.frames, fps: ev.fps })}` : "";
      caption.textContent = `${t("step")} ${ev.step} · ${Number(slider.value) + 1}/${list.length}${size}${video}`;
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
    insertSorted(this.grid, this.cards, key, element);
    element.hidden = !this.ctx.shown(run, tag);
    this.ctx.scheduler.observe(card);
    this.empty.hidden = true;
    return card;
  }
}
