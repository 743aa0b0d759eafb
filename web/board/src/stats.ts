// The fleet's resource use: GET /v1/stats every 2 s while the page is
// visible (there is no stream for stats). Each answer goes to the cards and
// the fleet plot; a failing poll says why once, not every 2 s.

import { type FleetStats, getJson } from "./api";
import { messageOf, report } from "./errors";

export const STATS_INTERVAL_MS = 2000;

export class StatsPoller {
  private timer: ReturnType<typeof setInterval> | null = null;
  private inFlight = false;
  private lastError = "";
  private readonly onVisible = () => {
    if (document.visibilityState === "visible") void this.poll();
  };

  constructor(
    private readonly onStats: (s: FleetStats, atMs: number) => void,
    private readonly onTick: () => void,
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.poll(), STATS_INTERVAL_MS);
    document.addEventListener("visibilitychange", this.onVisible);
    void this.poll();
  }

  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    document.removeEventListener("visibilitychange", this.onVisible);
  }

  private async poll(): Promise<void> {
    if (document.visibilityState !== "visible" || this.inFlight || this.timer === null) return;
    this.inFlight = true;
    try {
      const stats = await getJson<FleetStats>("/v1/stats");
      const at = Date.parse(stats.at);
      this.onStats(stats, Number.isNaN(at) ? Date.now() : at);
      this.lastError = "";
    } catch (e) {
      const m = messageOf(e);
      if (m !== this.lastError) report("stats", e);
      this.lastError = m;
    } finally {
      this.inFlight = false;
    }
    this.onTick();
  }
}
