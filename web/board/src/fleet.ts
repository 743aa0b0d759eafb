// A fleet of agent runs from a form: one instruction per line, each a run
// (POST /v1/agents) with the label fleet=<name> (also on its environment,
// so the board's label filter selects the fleet and Terminate all ends it),
// optionally forked from a snapshot. At most N run at once: the board
// starts the next when one ends (it reads each running run every
// POLL_MS), and a 429 (moatd's own bound on runs) waits likewise before it
// tries again (RETRY_MS when none of the fleet's runs is running). Stop all
// stops the running ones and starts no more.

import { type AgentRun, ApiError, enc, getJson, send } from "./api";
import { button, el, replace, setText } from "./dom";
import { messageOf } from "./errors";
import { agentFields, field, input, numberOf } from "./forms";
import { may } from "./session";
import type { SpawnHooks } from "./spawn";

const MAX_INSTRUCTIONS = 100;
const POLL_MS = 500;
const RETRY_MS = 2000;
const ENDED = new Set(["completed", "failed", "max_iterations", "stopped"]);

interface Member {
  instruction: string;
  run?: AgentRun;
  /** "waiting", a run's state, or "not started" (with error). */
  state: string;
  error?: string;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export function fleetForm(hooks: SpawnHooks): HTMLElement {
  const instructions = el("textarea", { name: "instructions", rows: 5, required: true, "data-testid": "fleet-instructions", placeholder: `one instruction per line (at most ${MAX_INSTRUCTIONS})` });
  const name = input("name", { required: true, placeholder: "nightly-tests" }, "fleet");
  const parallel = input("parallel", { type: "number", min: "1", max: "32", value: "4" }, "fleet");
  const snapshot = input("snapshot", { placeholder: "optional: snap-…" }, "fleet");
  const agent = agentFields("fleet");
  const status = el("div", { class: "form-status", "data-testid": "fleet-status", role: "status" });
  const list = el("ol", { class: "fleet-runs", "data-testid": "fleet-runs" });
  const submit = el("button", { type: "submit", class: "primary", "data-testid": "fleet-start" }, "Start fleet");
  let members: Member[] = [];
  let stopping = false;
  const stopAll = button("Stop all", { class: "danger", "data-testid": "fleet-stop", hidden: true }, async () => {
    stopping = true;
    const running = members.filter((m) => m.run && !ENDED.has(m.state));
    await Promise.all(
      running.map((m) =>
        send<AgentRun>("POST", `/v1/agents/${enc(m.run?.id ?? "")}/stop`).then(
          (run) => update(m, run),
          (e: unknown) => {
            m.error = messageOf(e);
          },
        ),
      ),
    );
    show();
  });
  if (!may("create")) {
    submit.disabled = true;
    submit.title = "needs the 'create' scope";
  }
  if (!may("destroy")) {
    stopAll.disabled = true;
    stopAll.title = "needs the 'destroy' scope";
  }

  const update = (m: Member, run: AgentRun) => {
    m.run = run;
    m.state = run.state;
  };

  const show = () => {
    const started = members.filter((m) => m.run).length;
    const ended = members.filter((m) => ENDED.has(m.state)).length;
    const failed = members.filter((m) => m.state === "not started").length;
    setText(status, `started ${started} · ended ${ended} · total ${members.length}${failed ? ` · ${failed} not started` : ""}${stopping ? " · stopping" : ""}`);
    replace(
      list,
      ...members.map((m) =>
        el(
          "li",
          { "data-testid": "fleet-run", "data-state": m.state, "data-run": m.run?.id },
          el("span", { class: "badge" }, m.state),
          " ",
          m.run ? el("code", {}, m.run.id) : null,
          " ",
          el("span", { class: "muted" }, m.instruction.length > 80 ? `${m.instruction.slice(0, 80)}…` : m.instruction),
          m.error ? el("div", { class: "error" }, m.error) : null,
        ),
      ),
    );
  };

  /** Reads each running run again; true when any ended. */
  const poll = async (): Promise<boolean> => {
    let any = false;
    await Promise.all(
      members
        .filter((m) => m.run && !ENDED.has(m.state))
        .map(async (m) => {
          try {
            update(m, await getJson<AgentRun>(`/v1/agents/${enc(m.run?.id ?? "")}`));
            if (ENDED.has(m.state)) any = true;
          } catch (e) {
            m.error = messageOf(e);
          }
        }),
    );
    return any;
  };

  const run = async (base: Record<string, unknown>, n: number) => {
    const running = () => members.filter((m) => m.run && !ENDED.has(m.state)).length;
    let next = 0;
    while (!stopping && next < members.length) {
      while (!stopping && next < members.length && running() < n) {
        const m = members[next];
        if (!m) break;
        try {
          const started = await send<AgentRun>("POST", "/v1/agents", { ...base, instruction: m.instruction });
          update(m, started);
          m.error = undefined;
          hooks.started(started);
          next++;
        } catch (e) {
          if (e instanceof ApiError && e.status === 429) {
            m.error = `waiting: ${e.message}`;
            break; // moatd's bound: wait for a run to end (or a while), then again
          }
          m.state = "not started";
          m.error = messageOf(e);
          next++;
        }
        show();
      }
      show();
      if (next >= members.length) break;
      // Here after a 429: soon again while a run of ours may end, else after a while.
      await sleep(running() > 0 ? POLL_MS : RETRY_MS);
      await poll();
    }
    for (const m of members.slice(next)) if (m.state === "waiting") m.state = "not started";
    // Stop all while a start was on its way: that run is stopped too.
    if (stopping) {
      await poll();
      await Promise.all(members.filter((m) => m.run && !ENDED.has(m.state)).map((m) => send<AgentRun>("POST", `/v1/agents/${enc(m.run?.id ?? "")}/stop`).then((r) => update(m, r), () => undefined)));
    }
    while (running() > 0) {
      show();
      await sleep(POLL_MS);
      await poll();
    }
    show();
  };

  const form = el(
    "form",
    { class: "spawn-form", "data-testid": "fleet-form" },
    el("h3", {}, "Fleet of agent runs"),
    field("instructions", instructions, "one per line: a run and an environment each"),
    el("div", { class: "row" }, field("fleet name", name, "label fleet=<name>"), field("parallel", parallel, "at most at once"), field("snapshot", snapshot, "fork each from it")),
    ...agent.nodes,
    el("div", { class: "row" }, submit, stopAll),
    status,
    list,
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    let base: Record<string, unknown>;
    let lines: string[];
    let n: number;
    try {
      lines = instructions.value.split("\n").map((l) => l.trim()).filter(Boolean);
      if (lines.length === 0) throw new Error("instructions: one per line, none given");
      if (lines.length > MAX_INSTRUCTIONS) throw new Error(`instructions: ${lines.length} lines, at most ${MAX_INSTRUCTIONS}`);
      const fleet = name.value.trim();
      if (!fleet) throw new Error("fleet name: required (it becomes the label fleet=<name>)");
      n = numberOf(parallel) ?? 4;
      if (!Number.isInteger(n) || n < 1 || n > 32) throw new Error("parallel: a whole number from 1 to 32");
      base = { ...agent.body(), labels: { fleet } };
      const snap = snapshot.value.trim();
      if (snap) base["snapshot"] = snap;
    } catch (e) {
      setText(status, messageOf(e));
      status.className = "form-status error";
      return;
    }
    members = lines.map((instruction) => ({ instruction, state: "waiting" }));
    stopping = false;
    submit.disabled = true;
    stopAll.hidden = false;
    status.className = "form-status";
    show();
    void run(base, n)
      .catch((e: unknown) => {
        setText(status, messageOf(e));
        status.className = "form-status error";
      })
      .finally(() => {
        agent.clearKey();
        submit.disabled = !may("create");
        stopAll.hidden = true;
      });
  });
  return form;
}
