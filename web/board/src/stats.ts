// The fleet's resource use: GET /v1/stats?follow=1, a reading every 2 s as
// Server-Sent Events while the page is visible (closed while it is hidden).
// Each reading goes to the cards and the fleet plot. A stream that moatd
// ended or refused (a restart, a 503, a revoked key) is read once without
// following (so that a 401 signs the page out, as any request's does),
// then opened again after a pause; a failure says why once, not at every
// try.

import { type FleetStats, getJson } from "./api";
import { messageOf, report } from "./errors";

export const STATS_INTERVAL_MS = 2000;
const REOPEN_MS = 3000;

export class StatsStream {
  private source: EventSource | null = null;
  private reopen: ReturnType<typeof setTimeout> | null = null;
  private running = false;
  private failed = false;
  private readonly onVisible = () => {
    if (document.visibilityState === "visible") this.open();
    else this.close();
  };

  constructor(
    private readonly onStats: (s: FleetStats, atMs: number) => void,
    private readonly onTick: () => void,
  ) {}

  start(): void {
    this.running = true;
    document.addEventListener("visibilitychange", this.onVisible);
    if (document.visibilityState === "visible") this.open();
  }

  stop(): void {
    this.running = false;
    document.removeEventListener("visibilitychange", this.onVisible);
    this.close();
  }

  private open(): void {
    if (!this.running || this.source) return;
    const source = new EventSource(`/v1/stats?follow=1&interval_ms=${STATS_INTERVAL_MS}`);
    this.source = source;
    source.addEventListener("stats", (ev) => {
      let stats: FleetStats;
      try {
        stats = JSON.parse((ev as MessageEvent<string>).data) as FleetStats;
      } catch (e) {
        report("stats", e);
        return;
      }
      this.failed = false;
      const at = Date.parse(stats.at);
      this.onStats(stats, Number.isNaN(at) ? Date.now() : at);
      this.onTick();
    });
    source.addEventListener("error", () => {
      // The browser retries a dropped stream itself; one it gave up on
      // (CLOSED) is asked once plainly, then opened again here.
      if (source.readyState !== EventSource.CLOSED) return;
      this.close();
      void this.probe();
    });
  }

  private async probe(): Promise<void> {
    try {
      const stats = await getJson<FleetStats>("/v1/stats");
      const at = Date.parse(stats.at);
      this.onStats(stats, Number.isNaN(at) ? Date.now() : at);
      this.onTick();
    } catch (e) {
      if (!this.failed) report("stats", new Error(`the stats stream ended: ${messageOf(e)}`));
      this.failed = true;
    }
    if (this.running && this.source === null) this.reopen = setTimeout(() => this.open(), REOPEN_MS);
  }

  private close(): void {
    if (this.reopen !== null) clearTimeout(this.reopen);
    this.reopen = null;
    this.source?.close();
    this.source = null;
  }
}
