// Toasts: short notices in a corner of the page that go away by themselves. Text is only ever set
// as textContent. At most MAX_TOASTS are shown; a newer one pushes out the oldest.
import { el } from "./dom.js";
import { t } from "./i18n.js";

/** Toasts on screen at once. */
export const MAX_TOASTS = 4;
/** Milliseconds a toast stays (errors stay twice as long). */
export const TOAST_MS = 8000;

export class Toasts {
  constructor() {
    this.element = el("div", { class: "toasts", role: "status", "aria-live": "polite" });
    /** Toasts shown so far (for tests). */
    this.shown = 0;
  }

  /**
   * Show a toast.
   * @param {{title: string, body?: string, level?: "info"|"warn"|"error", onClick?: () => void}} toast
   */
  show({ title, body = "", level = "warn", onClick = null }) {
    const close = el("button", { type: "button", class: "icon toast-close", "aria-label": t("close"), text: "×" });
    const node = el(
      "div",
      { class: "toast", dataset: { level } },
      el("strong", { class: "toast-title", text: title }),
      body ? el("span", { class: "toast-body", text: body }) : null,
      close,
    );
    const remove = () => node.remove();
    close.addEventListener("click", (e) => {
      e.stopPropagation();
      remove();
    });
    if (onClick) {
      node.classList.add("clickable");
      node.addEventListener("click", () => {
        onClick();
        remove();
      });
    }
    this.element.append(node);
    while (this.element.children.length > MAX_TOASTS) this.element.firstChild.remove();
    setTimeout(remove, level === "error" ? 2 * TOAST_MS : TOAST_MS);
    this.shown++;
    return node;
  }
}
