// A terminal in an environment: xterm.js on moatd's shell WebSocket
// (docs/API.md, "Shell"). Binary frames carry the terminal's bytes both
// ways; text frames carry JSON control messages (hello, resize, exit, end,
// error). The WebSocket is same-origin and authenticated by the session
// cookie. A new shell is the default; the picker above the screen
// (processes.ts) attaches it instead to one of the environment's running pty
// processes (`?process=P`: another viewer's shell, a `pty: true` process),
// which sends its last 64 KiB first, then everything live.

import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import { ApiError, enc, query, request } from "./api";
import { el, setText } from "./dom";
import { processPicker } from "./processes";

export interface TerminalView {
  readonly node: HTMLElement;
  /** The tab is shown again: the list of processes is read again. */
  shown(): void;
  dispose(): void;
}

interface Control {
  type: string;
  process?: number;
  pid?: number;
  cmd?: string[];
  exit_code?: number;
  reason?: string;
  message?: string;
  state?: string;
}

export function openTerminal(envId: string): TerminalView {
  const status = el("div", { class: "term-status", "data-testid": "terminal-status", role: "status" }, "connecting…");
  const screen = el("div", { class: "term-screen", "data-testid": "terminal" });
  const picker = processPicker(envId, (process) => connect(process));
  const node = el("div", { class: "term" }, status, picker.node, screen);

  const term = new Terminal({
    cursorBlink: true,
    fontFamily: "ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', monospace",
    fontSize: 13,
    scrollback: 5000,
    theme: { background: "#0d1117", foreground: "#d6dde6" },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);

  let ws: WebSocket | null = null;
  let greeted = false;
  let disposed = false;
  const encoder = new TextEncoder();

  const sendControl = (msg: object) => {
    if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify(msg));
  };

  /** A new shell (process undefined) or a viewer of process P; the previous connection ends. */
  const connect = (process?: number) => {
    if (disposed) return;
    const old = ws;
    ws = null;
    old?.close();
    greeted = false;
    status.classList.remove("error");
    setText(status, process === undefined ? "connecting…" : `attaching to process ${process}…`);
    picker.attached(undefined);
    term.reset();
    const what = process === undefined ? "the shell" : "the process";
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const path = `/v1/environments/${enc(envId)}/shell`;
    const q = query({ rows: term.rows, cols: term.cols, process });
    const sock = new WebSocket(`${proto}//${location.host}${path}${q}`);
    ws = sock;
    sock.binaryType = "arraybuffer";
    sock.addEventListener("message", (m: MessageEvent<ArrayBuffer | string>) => {
      if (ws !== sock) return;
      if (typeof m.data !== "string") {
        term.write(new Uint8Array(m.data));
        return;
      }
      let c: Control;
      try {
        c = JSON.parse(m.data) as Control;
      } catch {
        return;
      }
      if (c.type === "hello") {
        greeted = true;
        const shown = `process ${c.process ?? "?"} (${(c.cmd ?? []).join(" ")}, pid ${c.pid ?? "?"} inside)`;
        setText(status, process === undefined ? `shell: ${shown}` : `attached: ${shown}`);
        sendControl({ type: "resize", rows: term.rows, cols: term.cols });
        void picker.refresh().then(() => picker.attached(c.process));
      } else if (c.type === "exit") {
        setText(status, `${what} exited (${c.state ?? "exited"}, code ${c.exit_code ?? "?"})`);
      } else if (c.type === "end") {
        setText(status, `the terminal ended: ${c.reason ?? ""}`);
      } else if (c.type === "error") {
        setText(status, `moatd: ${c.message ?? ""}`);
      }
    });
    sock.addEventListener("close", (ev) => {
      if (disposed || ws !== sock) return;
      if (greeted) {
        if (!/exited|ended/.test(status.textContent ?? "")) setText(status, `disconnected (${ev.code}${ev.reason ? `: ${ev.reason}` : ""})`);
        return;
      }
      // A refused handshake says nothing to a WebSocket: ask the same path
      // plainly, which answers with moatd's reason (426 means it was fine).
      void request("GET", `${path}${q}`)
        .then(() => setText(status, `${what} closed (${ev.code})`))
        .catch((e: unknown) => {
          if (ws !== sock) return;
          const why = e instanceof ApiError && e.status !== 426 ? e.message : `closed (${ev.code})`;
          setText(status, process === undefined ? `no shell: ${why}` : `could not attach to process ${process}: ${why}`);
          status.classList.add("error");
        });
    });
  };

  term.onData((d) => {
    if (ws?.readyState === WebSocket.OPEN) ws.send(encoder.encode(d));
  });
  term.onBinary((d) => {
    if (ws?.readyState !== WebSocket.OPEN) return;
    const buf = new Uint8Array(d.length);
    for (let i = 0; i < d.length; i++) buf[i] = d.charCodeAt(i) & 0xff;
    ws.send(buf);
  });
  term.onResize(({ rows, cols }) => sendControl({ type: "resize", rows, cols }));

  const resize = new ResizeObserver(() => {
    if (screen.clientWidth > 0 && screen.clientHeight > 0) fit.fit();
  });

  // Opened once the node is in the document (xterm measures its cell size).
  queueMicrotask(() => {
    if (disposed) return;
    term.open(screen);
    fit.fit();
    resize.observe(screen);
    connect();
    term.focus();
  });

  return {
    node,
    shown() {
      void picker.refresh();
    },
    dispose() {
      disposed = true;
      resize.disconnect();
      ws?.close();
      term.dispose();
    },
  };
}
