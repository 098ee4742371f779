// A view's place on the page until its module is loaded (app.js, loadLaterViews): an element
// saying that it loads, which the view's own element replaces. It has not the view's class, so
// that a selector of the view (`.view.hparams`) finds the view itself, never the place it
// replaces (a test's locator that resolved the place lost it mid-action: CI).
import { el } from "../dom.js";
import { t } from "../i18n.js";

export class PendingView {
  /** @param {string} name the view's name (`histograms`, `graph`, ...) */
  constructor(name) {
    this.note = el("p", { class: "view-loading", role: "status", text: t("loadingView") });
    this.element = el("div", { class: "view", dataset: { pending: name } }, this.note);
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.note.textContent = t("loadingView");
  }
}
