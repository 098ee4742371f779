// A view's place on the page until its module is loaded (app.js, loadLaterViews): an element of
// the view's class, saying that it loads, which the view's own element replaces.
import { el } from "../dom.js";
import { t } from "../i18n.js";

export class PendingView {
  /** @param {string} name the view's name (`histograms`, `graph`, ...) */
  constructor(name) {
    this.note = el("p", { class: "view-loading", role: "status", text: t("loadingView") });
    this.element = el("div", { class: `view ${name}`, dataset: { pending: "" } }, this.note);
  }

  /** Re-apply interface strings after a language switch. */
  relabel() {
    this.note.textContent = t("loadingView");
  }
}
