// The board: at load, GET /ui/session decides between the sign-in form and
// the board; the board lists the environments, agent runs and approvals,
// then stays current through the audit event stream (SSE) and the stats
// poll. docs/BOARD.md describes it all.

import { Agents } from "./agents";
import { type Approval, type AuditEvent, type Environment, type SessionInfo, enc, getJson, send, setUnauthorizedHandler } from "./api";
import { Approvals } from "./approvals";
import { Board, parseFilter } from "./cards";
import { confirmDialog } from "./dialog";
import { button, el, replace, setText } from "./dom";
import { errorStrip, messageOf, report } from "./errors";
import { type StreamState, followEvents, latestEvents } from "./events";
import { Inspector } from "./inspect";
import { FleetPlot } from "./plots";
import { currentSession, describePrincipal, may, signInForm, signOut } from "./session";
import { spawnPanel } from "./spawn";
import { StatsStream } from "./stats";

/** Re-read the whole list this often, in case an event was missed. */
const RECONCILE_MS = 30_000;
/** Without the event stream (a key without `audit`), read the list this often. */
const POLL_LIST_MS = 3_000;

let teardown: (() => void) | null = null;

function showSignIn(notice = ""): void {
  teardown?.();
  teardown = null;
  document.title = "moat";
  replace(document.body, el("main", { class: "signin-page" }, signInForm(startBoard, notice)));
}

function startBoard(info: SessionInfo): void {
  teardown?.();
  const disposers: (() => void)[] = [];
  let stopped = false;
  teardown = () => {
    stopped = true;
    for (const d of disposers) d();
  };

  const inspector = new Inspector();
  const showEnvironment = (envId: string) => {
    const card = board.card(envId);
    if (!card) {
      report("show environment", new Error(`${envId} is not on the board (gone, or not this key's)`));
      return;
    }
    card.node.hidden = false;
    flash(card.node);
  };
  const board = new Board({
    inspect: (id) => inspector.open(id, board.card(id)?.env.labels["moat-agent-run"]),
    showAgent: (runId) => {
      const node = agents.card(runId);
      if (node) flash(node);
      else report("show agent run", new Error(`run ${runId} is not on the board`));
    },
  });
  const agents = new Agents({
    showEnvironment,
    inspectRun: (runId, envId) => inspector.open(envId && board.card(envId)?.live ? envId : undefined, runId, "transcript"),
  });
  const approvals = new Approvals(board, (n) => {
    document.title = n > 0 ? `(${n}) moat` : "moat";
  });
  const fleet = new FleetPlot();

  // ---- header: who, the stream, filters, bulk action, sign-out ----
  const streamText = el("span", { class: "stream", "data-testid": "stream-state" }, "connecting…");
  const setStream = (s: StreamState | string) => {
    setText(streamText, s);
    streamText.dataset["state"] = s;
  };
  const labelFilter = el("input", { type: "search", placeholder: "label k=v", "data-testid": "filter-label", "aria-label": "filter by label" });
  const stateFilter = el(
    "select",
    { "data-testid": "filter-state", "aria-label": "filter by state" },
    ...[
      ["live", "live (not gone)"],
      ["running", "running"],
      ["paused", "paused"],
      ["creating", "creating"],
      ["destroying", "destroying"],
      ["failed", "failed"],
      ["gone", "gone"],
      ["any", "any state"],
    ].map(([v, t]) => el("option", { value: v ?? "" }, t ?? "")),
  );
  const textFilter = el("input", { type: "search", placeholder: "search id, task, label…", "data-testid": "filter-text", "aria-label": "search" });
  let filterTimer: ReturnType<typeof setTimeout> | undefined;
  const applyFilter = () => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(() => {
      const f = parseFilter(labelFilter.value, stateFilter.value, textFilter.value);
      board.setFilter(f);
      agents.setText(f.text);
    }, 80);
  };
  for (const i of [labelFilter, textFilter]) i.addEventListener("input", applyFilter);
  stateFilter.addEventListener("change", applyFilter);

  const terminateAll = button("Terminate all…", { class: "danger", "data-testid": "terminate-all" }, () => confirmTerminateAll());
  if (!may("destroy")) {
    terminateAll.disabled = true;
    terminateAll.title = "needs the 'destroy' scope";
  }
  const beep = el("input", { type: "checkbox", "data-testid": "beep" });
  beep.addEventListener("change", () => (approvals.beep = beep.checked));
  const signOutButton = button("Sign out", { "data-testid": "signout" }, async () => {
    try {
      await signOut();
      showSignIn("Signed out.");
    } catch (e) {
      report("sign out", e);
    }
  });

  const header = el(
    "header",
    { class: "top" },
    el("span", { class: "brand" }, "moat"),
    el("span", { class: "who", "data-testid": "principal" }, describePrincipal(info.principal)),
    el("span", { class: "muted" }, "events: "),
    streamText,
    el("div", { class: "filters" }, labelFilter, stateFilter, textFilter, board.countNode, terminateAll),
    el("label", { class: "beep", title: "a short beep when an approval arrives" }, beep, " beep"),
    signOutButton,
  );
  const layout = el(
    "div",
    { class: "layout" },
    el("aside", { class: "side" }, approvals.panel, fleet.node, spawnPanel({ created: (env) => addEnvironments([env]), started: (run) => agents.upsert(run) })),
    el("main", { class: "main" }, agents.node, el("h2", { class: "sr-only" }, "Environments"), board.node),
  );
  replace(document.body, header, errorStrip(), layout, inspector.node);

  function flash(node: HTMLElement): void {
    node.scrollIntoView({ block: "center", behavior: "smooth" });
    node.classList.add("flash");
    setTimeout(() => node.classList.remove("flash"), 1500);
  }

  function addEnvironments(envs: Environment[], atEnd = false): void {
    board.upsert(envs, atEnd);
    for (const env of envs) approvals.placeOnCard(env.id);
  }

  function confirmTerminateAll(): void {
    const cards = board.selected();
    if (cards.length === 0) {
      report("terminate all", new Error("no live environment matches the filter"));
      return;
    }
    const ids = cards.map((c) => c.id);
    const shown = ids.slice(0, 12).join(", ") + (ids.length > 12 ? `, and ${ids.length - 12} more` : "");
    confirmDialog({
      title: `Terminate ${ids.length} environment${ids.length === 1 ? "" : "s"}?`,
      body: [`Every environment the filter shows ends now, with its processes and files: ${shown}.`, "Snapshots stay. This cannot be undone."],
      confirm: `Terminate ${ids.length}`,
      danger: true,
      action: async (progress) => {
        const failed: string[] = [];
        let next = 0;
        let done = 0;
        const worker = async () => {
          while (next < ids.length) {
            const id = ids[next++]!;
            try {
              await send("DELETE", `/v1/environments/${enc(id)}`);
            } catch (e) {
              failed.push(`${id}: ${messageOf(e)}`);
            }
            progress(`${++done} of ${ids.length} done${failed.length ? `, ${failed.length} refused` : ""}…`);
          }
        };
        await Promise.all(Array.from({ length: Math.min(8, ids.length) }, worker));
        if (failed.length) throw new Error(`${failed.length} of ${ids.length} were not terminated: ${failed.slice(0, 3).join("; ")}`);
      },
    });
  }

  // ---- live: the event stream ----
  const refetch = (id: string) => {
    getJson<Environment>(`/v1/environments/${enc(id)}`)
      .then((env) => addEnvironments([env]))
      .catch((e: unknown) => report(`environment ${id}`, e));
  };
  const onEvent = (e: AuditEvent) => {
    board.addEvent(e);
    inspector.live(e);
    const d = e.data ?? {};
    switch (e.type) {
      case "environment.created":
      case "environment.failed":
      case "environment.restored":
      case "environment.paused":
      case "environment.resumed":
      case "network.changed":
      case "policy.changed":
        if (e.environment) refetch(e.environment);
        break;
      case "environment.destroyed": {
        const state = d["state"];
        if (state === "gone" || state === "failed") board.ended(e.environment, state, String(d["reason"] ?? ""));
        else if (e.environment) refetch(e.environment);
        break;
      }
      case "environment.ttl_set": {
        const card = board.card(e.environment);
        const at = d["expires_at_ms"];
        if (card && typeof at === "number") card.update({ ...card.env, expires_at: new Date(at).toISOString() });
        break;
      }
      case "approval.requested":
        approvals.add(d as unknown as Approval);
        break;
      case "approval.decided":
        if (typeof d["id"] === "string") approvals.drop(d["id"]);
        break;
      default:
        if (e.type.startsWith("agent.") && typeof d["run"] === "string") agents.scheduleRefresh(d["run"]);
    }
  };

  const reconcile = async () => {
    const asked = Date.now();
    try {
      const { environments } = await getJson<{ environments: Environment[] }>("/v1/environments");
      const listed = new Set(environments.map((env) => env.id));
      addEnvironments(environments.filter((env) => !board.card(env.id)), true);
      addEnvironments(environments.filter((env) => board.card(env.id)));
      // A live card the list left out has ended (the list has no gone ones):
      // its own record says how. Cards newer than the list are not judged.
      for (const card of [...board.all()]) {
        if (!card.live || listed.has(card.id) || card.seenAt >= asked) continue;
        getJson<Environment>(`/v1/environments/${enc(card.id)}`)
          .then((env) => addEnvironments([env]))
          .catch(() => board.ended(card.id, "gone", "no longer visible to this session"));
      }
    } catch (e) {
      report("list environments", e);
    }
  };

  const startStream = async () => {
    let start: { last: number; recent: AuditEvent[] };
    try {
      start = await latestEvents();
    } catch (e) {
      // A key without the `audit` scope: no events; the list is polled instead.
      setStream(`off (${messageOf(e)}); polling`);
      const t = setInterval(() => void reconcile(), POLL_LIST_MS);
      disposers.push(() => clearInterval(t));
      return;
    }
    if (stopped) return;
    for (const e of start.recent) board.addEvent(e);
    const source = followEvents(start.last, onEvent, setStream);
    disposers.push(() => source.close());
  };

  // ---- start ----
  const boot = async () => {
    if (may("read")) {
      try {
        const { environments } = await getJson<{ environments: Environment[] }>("/v1/environments");
        addEnvironments(environments, true);
      } catch (e) {
        report("list environments", e);
      }
      agents.load().catch((e: unknown) => report("list agent runs", e));
    } else {
      report("the board", new Error("this key lacks the 'read' scope: it cannot list environments"));
    }
    approvals.refresh().catch((e: unknown) => report("approvals", e));
    if (may("audit")) await startStream();
    else {
      setStream("off (no 'audit' scope); polling");
      const t = setInterval(() => void reconcile(), POLL_LIST_MS);
      disposers.push(() => clearInterval(t));
    }
  };
  void boot();

  const stats = new StatsStream(
    (s, at) => board.applyStats(s.environments, at),
    () => {
      approvals.refresh().catch((e: unknown) => report("approvals", e));
      fleet.add(board.counts(), approvals.size);
    },
  );
  if (may("read")) stats.start();
  disposers.push(() => stats.stop());
  const clockTimer = setInterval(() => board.tick(Date.now()), 1000);
  disposers.push(() => clearInterval(clockTimer));
  const reconcileTimer = setInterval(() => void reconcile(), RECONCILE_MS);
  disposers.push(() => clearInterval(reconcileTimer));
  disposers.push(() => inspector.dispose());
}

async function main(): Promise<void> {
  // A 401 from the API usually means the session ended (a moatd restart, a
  // revoked key); the session itself says whether it did. If it holds, the
  // 401 was the request's own and its caller shows it.
  let checking = false;
  setUnauthorizedHandler((message) => {
    if (!teardown || checking) return;
    checking = true;
    currentSession()
      .then((info) => {
        if (!info) showSignIn(`Signed out: ${message}`);
      })
      .catch((e: unknown) => report("the session", e))
      .finally(() => {
        checking = false;
      });
  });
  let info: SessionInfo | null;
  try {
    info = await currentSession();
  } catch (e) {
    replace(document.body, el("main", { class: "signin-page" }, el("p", { class: "form-error", "data-testid": "signin-error" }, `moatd: ${messageOf(e)}`)));
    return;
  }
  if (info) startBoard(info);
  else showSignIn();
}

void main();
