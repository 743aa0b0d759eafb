// Forms that start things: an environment (POST /v1/environments) and an
// agent run (POST /v1/agents). moatd validates; its message (naming the
// field) is shown under the form.

import { type AgentRun, type Environment, send } from "./api";
import { el, setText } from "./dom";
import { messageOf } from "./errors";
import { may, who } from "./session";

export interface SpawnHooks {
  created(env: Environment): void;
  started(run: AgentRun): void;
}

function field(label: string, input: HTMLElement, hint = ""): HTMLElement {
  return el("label", { class: "field" }, el("span", {}, label), input, hint ? el("small", { class: "muted" }, hint) : null);
}

function input(name: string, attrs: Record<string, string | number | boolean> = {}): HTMLInputElement {
  return el("input", { type: "text", name, "data-testid": `spawn-${name}`, ...attrs });
}

function numberOf(i: HTMLInputElement): number | undefined {
  const v = i.value.trim();
  if (!v) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n)) throw new Error(`${i.name}: not a number`);
  return n;
}

function jsonOf(t: HTMLTextAreaElement): unknown {
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

function drop<T extends Record<string, unknown>>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

function environmentForm(hooks: SpawnHooks): HTMLElement {
  const task = input("task_id", { placeholder: "optional" });
  const template = input("template", { value: "host" });
  const cpus = input("cpus", { type: "number", step: "0.01", min: "0.01", placeholder: "1" });
  const ram = input("ram_mb", { type: "number", min: "16", placeholder: "1024" });
  const pids = input("pids", { type: "number", min: "4", placeholder: "1024" });
  const storage = input("storage_gb", { type: "number", step: "0.01", placeholder: "4" });
  const ttl = input("ttl_s", { type: "number", min: "1", placeholder: "3600" });
  const network = el("select", { name: "network", "data-testid": "spawn-network" }, el("option", { value: "" }, "default (none)"), el("option", { value: "none" }, "none"), el("option", { value: "open" }, "open"), el("option", { value: "allowlist" }, "allowlist"));
  const allow = input("allow", { placeholder: "*.pypi.org, github.com:443" });
  const permissions = el("textarea", { name: "permissions", rows: 3, "data-testid": "spawn-permissions", placeholder: '{"run_command": "ask"}' });
  const labels = input("labels", { placeholder: "team=search, tier=2" });
  const status = el("div", { class: "form-status", "data-testid": "spawn-env-status", role: "status" });
  const submit = el("button", { type: "submit", class: "primary", "data-testid": "spawn-env" }, "Create environment");
  if (!may("create")) {
    submit.disabled = true;
    submit.title = "needs the 'create' scope";
  }
  const form = el(
    "form",
    { class: "spawn-form", "data-testid": "spawn-env-form" },
    el("h3", {}, "Environment"),
    field("task id", task),
    field("template", template, "host, or an absolute root directory"),
    el("div", { class: "row" }, field("cpus", cpus), field("ram MB", ram), field("pids", pids), field("storage GB", storage)),
    el("div", { class: "row" }, field("ttl s", ttl), field("network", network), field("allow", allow, "allowlist entries")),
    field("permissions (JSON)", permissions, "docs/GATE.md"),
    field("labels", labels),
    submit,
    status,
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    let body: Record<string, unknown>;
    try {
      const spec = drop({ cpus: numberOf(cpus), ram_mb: numberOf(ram), pids: numberOf(pids), storage_gb: numberOf(storage) });
      let net: unknown;
      if (network.value === "allowlist") {
        net = { mode: "allowlist", allow: allow.value.split(",").map((s) => s.trim()).filter(Boolean) };
      } else if (network.value) net = network.value;
      body = drop({
        task_id: task.value.trim() || undefined,
        template: template.value.trim() || undefined,
        spec: Object.keys(spec).length ? spec : undefined,
        ttl_s: numberOf(ttl),
        network: net,
        permissions: jsonOf(permissions),
        labels: labelsOf(labels.value),
      });
    } catch (e) {
      setText(status, messageOf(e));
      status.className = "form-status error";
      return;
    }
    submit.disabled = true;
    setText(status, "creating…");
    status.className = "form-status";
    send<Environment>("POST", "/v1/environments", body)
      .then((env) => {
        setText(status, `created ${env.id}`);
        hooks.created(env);
      })
      .catch((e: unknown) => {
        setText(status, messageOf(e));
        status.className = "form-status error";
      })
      .finally(() => {
        submit.disabled = false;
      });
  });
  return form;
}

function agentForm(hooks: SpawnHooks): HTMLElement {
  const instruction = el("textarea", { name: "instruction", rows: 3, required: true, "data-testid": "spawn-instruction", placeholder: "What the agent should do" });
  const kind = el("select", { name: "kind", "data-testid": "spawn-kind" }, el("option", { value: "anthropic" }, "anthropic"), el("option", { value: "openai" }, "openai (also Ollama, vLLM)"), el("option", { value: "replay" }, "replay a run"));
  const model = input("model", { placeholder: "claude-sonnet-5 / gpt-… / replay: the run id" });
  const baseUrl = input("base_url", { placeholder: "default for the kind" });
  const keyEnv = input("api_key_env", { placeholder: "ANTHROPIC_API_KEY" });
  const key = input("api_key", { type: "password", autocomplete: "off", placeholder: "or the key itself" });
  const maxIter = input("max_iterations", { type: "number", min: "1", max: "1000", placeholder: "30" });
  const permissions = el("textarea", { name: "permissions", rows: 2, placeholder: '{"run_command": "ask"}' });
  const keep = el("input", { type: "checkbox", name: "keep_environment" });
  const status = el("div", { class: "form-status", "data-testid": "spawn-agent-status", role: "status" });
  const submit = el("button", { type: "submit", class: "primary", "data-testid": "spawn-agent" }, "Start agent run");
  if (!may("create")) {
    submit.disabled = true;
    submit.title = "needs the 'create' scope";
  }
  const form = el(
    "form",
    { class: "spawn-form", "data-testid": "spawn-agent-form" },
    el("h3", {}, "Agent run"),
    field("instruction", instruction),
    el("div", { class: "row" }, field("provider", kind), field("model", model)),
    field("base URL", baseUrl),
    el("div", { class: "row" }, field("API key variable", keyEnv, who().master ? "a variable of moatd's environment" : "the master token only"), field("API key", key, "held in moatd's memory for the run")),
    el("div", { class: "row" }, field("max iterations", maxIter), el("label", { class: "field check" }, keep, el("span", {}, "keep the environment"))),
    field("permissions (JSON)", permissions),
    submit,
    status,
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    let body: Record<string, unknown>;
    try {
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
      body = drop({
        instruction: instruction.value,
        provider,
        max_iterations: numberOf(maxIter),
        permissions: jsonOf(permissions),
        keep_environment: keep.checked || undefined,
      });
    } catch (e) {
      setText(status, messageOf(e));
      status.className = "form-status error";
      return;
    }
    submit.disabled = true;
    setText(status, "starting…");
    status.className = "form-status";
    send<AgentRun>("POST", "/v1/agents", body)
      .then((run) => {
        key.value = "";
        setText(status, `started run ${run.id} in ${run.environment ?? "?"}`);
        hooks.started(run);
      })
      .catch((e: unknown) => {
        setText(status, messageOf(e));
        status.className = "form-status error";
      })
      .finally(() => {
        submit.disabled = false;
      });
  });
  return form;
}

export function spawnPanel(hooks: SpawnHooks): HTMLElement {
  return el(
    "details",
    { class: "spawn", "data-testid": "spawn" },
    el("summary", {}, "Spawn"),
    el("div", { class: "spawn-forms" }, environmentForm(hooks), agentForm(hooks)),
  );
}
