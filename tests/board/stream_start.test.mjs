// The board's search for the end of the audit log (web/board/src/events.ts,
// latestEvents): moatd's event pages run oldest first, so the page finds
// the newest id with a few page reads before it follows the stream. Checked
// here against simulated logs (no moatd, no browser): dense, sparse (an API
// key sees only its own environments' events), pruned at the start, empty,
// and exactly a page long.

import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const require = createRequire(join(repo, "web", "board", "package.json"));
const esbuild = require("esbuild");

// events.ts as an ES module for node (fetch is replaced below).
const bundled = await esbuild.build({
  entryPoints: [join(repo, "web", "board", "src", "events.ts")],
  bundle: true,
  format: "esm",
  platform: "neutral",
  write: false,
  logLevel: "error",
});
const { latestEvents, PAGE } = await import(`data:text/javascript;base64,${Buffer.from(bundled.outputFiles[0].text).toString("base64")}`);

/** A moatd whose log holds `ids` (ascending): GET /v1/events?since=N answers the next page. */
function fakeLog(ids) {
  const seen = { requests: 0 };
  globalThis.fetch = async (url) => {
    seen.requests++;
    const since = Number(new URL(url, "http://moatd").searchParams.get("since") ?? 0);
    // The first id after `since` (binary search), then a page.
    let lo = 0;
    let hi = ids.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (ids[mid] <= since) lo = mid + 1;
      else hi = mid;
    }
    const page = ids.slice(lo, lo + PAGE);
    const body = page.map((id) => `id: ${id}\nevent: exec.ended\ndata: ${JSON.stringify({ id, type: "exec.ended", environment: "e", data: {} })}\n\n`).join("");
    return new Response(body, { status: 200, headers: { "Content-Type": "text/event-stream" } });
  };
  return seen;
}

const range = (from, to, step = 1) => Array.from({ length: Math.floor((to - from) / step) + 1 }, (_, i) => from + i * step);

describe("the board's search for the newest event", () => {
  for (const [name, ids, maxRequests] of [
    ["an empty log", [], 1],
    ["a short log", range(1, 5), 1],
    ["exactly one page", range(1, PAGE), 3],
    ["one page and one", range(1, PAGE + 1), 3],
    ["a million events", range(1, 1_000_000), 25],
    ["a key's sparse view (every 7th of 700,000)", range(7, 700_000, 7), 25],
    ["a log pruned to its last 100,000 of 3 million", range(2_900_001, 3_000_000), 25],
  ]) {
    it(`finds the end of ${name}`, async () => {
      const seen = fakeLog(ids);
      const { last, recent } = await latestEvents();
      const newest = ids[ids.length - 1] ?? 0;
      assert.equal(last, newest);
      assert.ok(seen.requests <= maxRequests, `${seen.requests} requests`);
      if (ids.length) {
        assert.equal(recent[recent.length - 1].id, newest, "the newest events fill the cards");
        assert.ok(recent.length >= Math.min(ids.length, PAGE / 2), `${recent.length} recent events`);
      }
      console.log(`# ${name}: ${seen.requests} requests, ${recent.length} recent events`);
    });
  }
});
