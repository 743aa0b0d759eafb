// Sign-in and sign-out (docs/BOARD.md, "Session"). The token a person types
// goes to moatd once, in POST /ui/session; moatd answers with an HttpOnly
// session cookie (which the page cannot read) and a CSRF token, which is
// kept in api.ts's variable for the life of the page only.

import { ApiError, request, setCsrf, type Principal, type SessionInfo } from "./api";
import { el } from "./dom";
import { messageOf } from "./errors";

let principal: Principal = { master: false };

/** The signed-in principal's right to `scope` (the master token has all). */
export function may(scope: string): boolean {
  return principal.master || (principal.scopes ?? []).includes(scope);
}

export function who(): Principal {
  return principal;
}

function adopt(info: SessionInfo): SessionInfo {
  setCsrf(info.csrf);
  principal = info.principal;
  return info;
}

/** The session the cookie carries, or null when not signed in (401). */
export async function currentSession(): Promise<SessionInfo | null> {
  try {
    const res = await request("GET", "/ui/session");
    return adopt((await res.json()) as SessionInfo);
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return null;
    throw e;
  }
}

export async function signIn(token: string): Promise<SessionInfo> {
  const res = await request("POST", "/ui/session", { body: { token } });
  return adopt((await res.json()) as SessionInfo);
}

export async function signOut(): Promise<void> {
  await request("DELETE", "/ui/session");
  setCsrf("");
}

/** "master token" or "key 5be0c2a97d13 (agent-7): read, exec". */
export function describePrincipal(p: Principal): string {
  if (p.master) return "master token";
  const name = p.name ? ` (${p.name})` : "";
  return `key ${p.key ?? "?"}${name}: ${(p.scopes ?? []).join(", ") || "no scopes"}`;
}

/** The sign-in form; `signedIn` runs once moatd accepted the token. */
export function signInForm(signedIn: (info: SessionInfo) => void, notice = ""): HTMLElement {
  const token = el("input", {
    type: "password",
    name: "token",
    id: "token",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
    placeholder: "master token or moat_… API key",
    "data-testid": "token",
  });
  const error = el("p", { class: "form-error", "data-testid": "signin-error", role: "alert" }, notice);
  const submit = el("button", { type: "submit", "data-testid": "signin" }, "Sign in");
  const form = el(
    "form",
    { class: "signin", "data-testid": "signin-form" },
    el("h1", {}, "moat"),
    el("label", { for: "token" }, "Token"),
    token,
    submit,
    error,
    el(
      "p",
      { class: "hint" },
      "The master token is in <state>/master-token (0600). The board keeps only a session cookie; sign out to end it.",
    ),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    error.textContent = "";
    submit.disabled = true;
    signIn(token.value.trim())
      .then((info) => {
        token.value = "";
        signedIn(info);
      })
      .catch((e: unknown) => {
        error.textContent = messageOf(e);
        token.select();
      })
      .finally(() => {
        submit.disabled = false;
      });
  });
  queueMicrotask(() => token.focus());
  return form;
}
