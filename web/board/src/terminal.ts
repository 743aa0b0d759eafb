// A terminal in an environment: xterm.js on moatd's shell WebSocket
// (docs/API.md, "Shell"). Binary frames carry the terminal's bytes both
// ways; text frames carry JSON control messages (hello, resize, exit, end,
// error). The WebSocket is same-origin and authenticated by the session
// cookie.

import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import { ApiError, enc, query, request } from "./api";
import { el, setText } from "./dom";

export interface TerminalView {
  readonly node: HTMLElement;
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
  const node = el("div", { class: "term" }, status, screen);

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

  const connect = () => {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const path = `/v1/environments/${enc(envId)}/shell`;
    ws = new WebSocket(`${proto}//${location.host}${path}${query({ rows: term.rows, cols: term.cols })}`);
    ws.binaryType = "arraybuffer";
    ws.addEventListener("message", (m: MessageEvent<ArrayBuffer | string>) => {
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
        setText(status, `shell: process ${c.process ?? "?"} (${(c.cmd ?? []).join(" ")}, pid ${c.pid ?? "?"} inside)`);
        sendControl({ type: "resize", rows: term.rows, cols: term.cols });
      } else if (c.type === "exit") {
        setText(status, `the shell exited (${c.state ?? "exited"}, code ${c.exit_code ?? "?"})`);
      } else if (c.type === "end") {
        setText(status, `the terminal ended: ${c.reason ?? ""}`);
      } else if (c.type === "error") {
        setText(status, `moatd: ${c.message ?? ""}`);
      }
    });
    ws.addEventListener("close", (ev) => {
      if (disposed) return;
      if (greeted) {
        if (!/exited|ended/.test(status.textContent ?? "")) setText(status, `disconnected (${ev.code}${ev.reason ? `: ${ev.reason}` : ""})`);
        return;
      }
      // A refused handshake says nothing to a WebSocket: ask the same path
      // plainly, which answers with moatd's reason (426 means it was fine).
      void request("GET", path)
        .then(() => setText(status, `the shell closed (${ev.code})`))
        .catch((e: unknown) => {
          const why = e instanceof ApiError && e.status !== 426 ? e.message : `closed (${ev.code})`;
          setText(status, `no shell: ${why}`);
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
    dispose() {
      disposed = true;
      resize.disconnect();
      ws?.close();
      term.dispose();
    },
  };
}
