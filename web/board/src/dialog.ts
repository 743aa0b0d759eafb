// The board's own confirmation dialog (a <dialog> element, not
// window.confirm): it says what will happen, and the action runs only when
// the person presses the named button. An error from the action is shown in
// the dialog, which then stays open.

import { el } from "./dom";
import { messageOf } from "./errors";

export interface ConfirmOptions {
  title: string;
  /** Lines of text saying exactly what will happen. */
  body: (string | Node)[];
  confirm: string;
  danger?: boolean;
  /** Runs on confirm (it may say how far it got); the dialog closes when it resolves. */
  action: (progress: (text: string) => void) => Promise<unknown>;
}

export function confirmDialog(opts: ConfirmOptions): HTMLDialogElement {
  const error = el("p", { class: "form-error", "data-testid": "dialog-error", role: "alert" });
  const progress = el("p", { class: "muted", "data-testid": "dialog-progress", role: "status" });
  const ok = el("button", { type: "button", class: opts.danger ? "danger" : "primary", "data-testid": "dialog-confirm" }, opts.confirm);
  const cancel = el("button", { type: "button", "data-testid": "dialog-cancel" }, "Cancel");
  const dialog = el(
    "dialog",
    { class: "confirm", "data-testid": "dialog" },
    el("h2", {}, opts.title),
    ...opts.body.map((line) => (typeof line === "string" ? el("p", {}, line) : line)),
    progress,
    error,
    el("div", { class: "dialog-buttons" }, cancel, ok),
  );
  const close = () => {
    dialog.close();
    dialog.remove();
  };
  cancel.addEventListener("click", close);
  dialog.addEventListener("cancel", (ev) => {
    if (ok.disabled) ev.preventDefault();
    else queueMicrotask(() => dialog.remove());
  });
  ok.addEventListener("click", () => {
    ok.disabled = true;
    cancel.disabled = true;
    error.textContent = "";
    opts
      .action((text) => {
        progress.textContent = text;
      })
      .then(close)
      .catch((e: unknown) => {
        error.textContent = messageOf(e);
        ok.disabled = false;
        cancel.disabled = false;
      });
  });
  document.body.append(dialog);
  dialog.showModal();
  cancel.focus();
  return dialog;
}
