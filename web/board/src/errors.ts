// Errors from moatd (or the network) are shown, never swallowed: each is a
// line of text in the error strip at the top of the board, and actions with
// a place of their own (a card, a form, a dialog) also show it there.

import { ApiError } from "./api";
import { button, el } from "./dom";

let strip: HTMLElement | null = null;
const MAX_SHOWN = 6;

export function errorStrip(): HTMLElement {
  strip ??= el("div", { class: "errors", "data-testid": "errors", role: "alert", "aria-live": "polite" });
  return strip;
}

/** The text a person reads for an error: moatd's `error.message` as it came. */
export function messageOf(e: unknown): string {
  if (e instanceof ApiError) return e.message;
  if (e instanceof Error) return e.message;
  return String(e);
}

/** Shows `e` in the error strip, prefixed with what was being done. */
export function report(what: string, e: unknown): void {
  if (e instanceof DOMException && e.name === "AbortError") return;
  const s = errorStrip();
  const line = el(
    "div",
    { class: "error", "data-testid": "error" },
    el("span", { class: "error-what" }, what),
    ": ",
    el("span", { class: "error-message" }, messageOf(e)),
  );
  line.append(
    button("×", { class: "close", title: "Dismiss", "aria-label": "Dismiss" }, () => line.remove()),
  );
  s.prepend(line);
  while (s.childElementCount > MAX_SHOWN) s.lastElementChild?.remove();
}
