// Forms that start things: an environment (POST /v1/environments), an
// agent run (POST /v1/agents) and a fleet of them (fleet.ts). moatd validates; its message (naming the
// field) is shown under the form.

import { type AgentRun, type Environment, send } from "./api";
import { el, setText } from "./dom";
import { messageOf } from "./errors";
import { fleetForm } from "./fleet";
import { agentFields, drop, field, input, jsonOf, labelsOf, numberOf } from "./forms";
import { may } from "./session";

export interface SpawnHooks {
  created(env: Environment): void;
  started(run: AgentRun): void;
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
  const agent = agentFields("spawn");
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
    ...agent.nodes,
    submit,
    status,
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    let body: Record<string, unknown>;
    try {
      body = { instruction: instruction.value, ...agent.body() };
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
        agent.clearKey();
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
    el("div", { class: "spawn-forms" }, environmentForm(hooks), agentForm(hooks), fleetForm(hooks)),
  );
}
