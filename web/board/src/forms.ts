// The pieces of the Spawn panel's forms (spawn.ts, fleet.ts): labelled
// fields, parsing what was typed, and the fields an agent run takes besides
// its instruction (provider, key, max iterations, permissions, keep).

import { el } from "./dom";
import { messageOf } from "./errors";
import { who } from "./session";

export function field(label: string, input: HTMLElement, hint = ""): HTMLElement {
  return el("label", { class: "field" }, el("span", {}, label), input, hint ? el("small", { class: "muted" }, hint) : null);
}

/** A text input named `name`, test id `${prefix}-${name}`. */
export function input(name: string, attrs: Record<string, string | number | boolean> = {}, prefix = "spawn"): HTMLInputElement {
  return el("input", { type: "text", name, "data-testid": `${prefix}-${name}`, ...attrs });
}

export function numberOf(i: HTMLInputElement): number | undefined {
  const v = i.value.trim();
  if (!v) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n)) throw new Error(`${i.name}: not a number`);
  return n;
}

export function jsonOf(t: HTMLTextAreaElement): unknown {
  const v = t.value.trim();
  if (!v) return undefined;
  try {
    return JSON.parse(v) as unknown;
  } catch (e) {
    throw new Error(`${t.name}: not JSON (${messageOf(e)})`);
  }
}

/** "team=search, tier=2" → {team: "search", tier: "2"}. */
export function labelsOf(text: string): Record<string, string> | undefined {
  const out: Record<string, string> = {};
  for (const term of text.split(/[,\n]+/)) {
    const t = term.trim();
    if (!t) continue;
    const at = t.indexOf("=");
    if (at <= 0) throw new Error(`labels: "${t}" is not key=value`);
    out[t.slice(0, at).trim()] = t.slice(at + 1).trim();
  }
  return Object.keys(out).length ? out : undefined;
}

export function drop<T extends Record<string, unknown>>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

export interface AgentFields {
  /** The rows of the form. */
  readonly nodes: HTMLElement[];
  /** provider, max_iterations, permissions, keep_environment; throws on what does not parse. */
  body(): Record<string, unknown>;
  /** Forgets the key typed (once moatd has it). */
  clearKey(): void;
}

/** What POST /v1/agents takes besides the instruction (docs/AGENTS.md). */
export function agentFields(prefix: string): AgentFields {
  const kind = el("select", { name: "kind", "data-testid": `${prefix}-kind` }, el("option", { value: "anthropic" }, "anthropic"), el("option", { value: "openai" }, "openai (also Ollama, vLLM)"), el("option", { value: "replay" }, "replay a run"));
  const model = input("model", { placeholder: "claude-sonnet-5 / gpt-… / replay: the run id" }, prefix);
  const baseUrl = input("base_url", { placeholder: "default for the kind" }, prefix);
  const keyEnv = input("api_key_env", { placeholder: "ANTHROPIC_API_KEY" }, prefix);
  const key = input("api_key", { type: "password", autocomplete: "off", placeholder: "or the key itself" }, prefix);
  const maxIter = input("max_iterations", { type: "number", min: "1", max: "1000", placeholder: "30" }, prefix);
  const permissions = el("textarea", { name: "permissions", rows: 2, "data-testid": `${prefix}-agent-permissions`, placeholder: '{"run_command": "ask"}' });
  const keep = el("input", { type: "checkbox", name: "keep_environment", "data-testid": `${prefix}-keep` });
  return {
    nodes: [
      el("div", { class: "row" }, field("provider", kind), field("model", model)),
      field("base URL", baseUrl),
      el("div", { class: "row" }, field("API key variable", keyEnv, who().master ? "a variable of moatd's environment" : "the master token only"), field("API key", key, "held in moatd's memory for the run")),
      el("div", { class: "row" }, field("max iterations", maxIter), el("label", { class: "field check" }, keep, el("span", {}, "keep the environment"))),
      field("permissions (JSON)", permissions),
    ],
    body() {
      const provider =
        kind.value === "replay"
          ? { kind: "replay", run: model.value.trim() }
          : drop({
              kind: kind.value,
              model: model.value.trim(),
              base_url: baseUrl.value.trim() || undefined,
              api_key_env: keyEnv.value.trim() || undefined,
              api_key: key.value || undefined,
            });
      return drop({
        provider,
        max_iterations: numberOf(maxIter),
        permissions: jsonOf(permissions),
        keep_environment: keep.checked || undefined,
      });
    },
    clearKey() {
      key.value = "";
    },
  };
}
