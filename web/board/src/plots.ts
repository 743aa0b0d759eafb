// Small plots drawn with SVG elements (no markup from strings): a sparkline
// per card metric, and the fleet's size by state over time.

import { el, setText, svg } from "./dom";

const W = 60;
const H = 16;

/** A line over the last samples of one metric, scaled to [0, max]. */
export class Sparkline {
  readonly node: SVGSVGElement;
  private readonly line: SVGPolylineElement;
  private readonly area: SVGPolygonElement;

  constructor(kind: string) {
    this.line = svg("polyline", { class: "spark-line", points: "" });
    this.area = svg("polygon", { class: "spark-area", points: "" });
    this.node = svg(
      "svg",
      { class: `spark spark-${kind}`, viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", "aria-hidden": "true" },
      this.area,
      this.line,
    );
  }

  draw(values: readonly number[], max: number, capacity: number): void {
    if (values.length === 0) return;
    const scale = max > 0 ? max : 1;
    const dx = W / Math.max(1, capacity - 1);
    const x0 = W - dx * (values.length - 1);
    let pts = "";
    for (let i = 0; i < values.length; i++) {
      const v = Math.min(1, Math.max(0, (values[i] ?? 0) / scale));
      pts += `${(x0 + i * dx).toFixed(1)},${(H - 1 - v * (H - 2)).toFixed(1)} `;
    }
    this.line.setAttribute("points", pts);
    this.area.setAttribute("points", `${x0.toFixed(1)},${H} ${pts}${W},${H}`);
  }
}

export const PLOT_STATES = ["running", "paused", "creating", "destroying", "failed", "gone"] as const;
export type PlotState = (typeof PLOT_STATES)[number];

interface Sample {
  at: number;
  counts: Record<PlotState, number>;
  pending: number;
}

const PW = 300;
const PH = 64;
/** Samples kept: 5 minutes at the stats poll's 2 s. */
const KEEP = 150;

/** The fleet's count by state (and pending approvals) over the last minutes. */
export class FleetPlot {
  readonly node: HTMLElement;
  private readonly samples: Sample[] = [];
  private readonly lines = new Map<string, SVGPolylineElement>();
  private readonly legend = new Map<string, Text>();
  private readonly scaleText = document.createTextNode("");

  constructor() {
    const plot = svg("svg", { class: "fleet-svg", viewBox: `0 0 ${PW} ${PH}`, preserveAspectRatio: "none", role: "img", "aria-label": "environments by state over time" });
    const legend = el("ul", { class: "fleet-legend" });
    for (const s of [...PLOT_STATES, "approvals"]) {
      const line = svg("polyline", { class: `fleet-line state-${s}`, points: "" });
      plot.append(line);
      this.lines.set(s, line);
      const count = document.createTextNode("0");
      this.legend.set(s, count);
      legend.append(el("li", { class: `state-${s}`, "data-testid": `fleet-${s}` }, el("span", { class: "swatch" }), `${s} `, el("b", {}, count)));
    }
    this.node = el(
      "section",
      { class: "fleet", "data-testid": "fleet-plot" },
      el("h2", {}, "Fleet"),
      plot,
      el("div", { class: "fleet-scale" }, this.scaleText),
      legend,
    );
  }

  add(counts: Record<PlotState, number>, pending: number): void {
    this.samples.push({ at: Date.now(), counts, pending });
    if (this.samples.length > KEEP) this.samples.shift();
    let max = 1;
    for (const s of this.samples) {
      for (const st of PLOT_STATES) max = Math.max(max, s.counts[st]);
      max = Math.max(max, s.pending);
    }
    // The samples so far fill the width (the scale line says how long they span).
    const dx = PW / Math.max(1, this.samples.length - 1);
    const x0 = 0;
    const y = (v: number) => (PH - 1 - (v / max) * (PH - 2)).toFixed(1);
    for (const [name, line] of this.lines) {
      let pts = "";
      this.samples.forEach((s, i) => {
        const v = name === "approvals" ? s.pending : s.counts[name as PlotState];
        pts += `${(x0 + i * dx).toFixed(1)},${y(v)} `;
      });
      line.setAttribute("points", pts);
    }
    for (const st of PLOT_STATES) setText(this.legend.get(st)!, String(counts[st]));
    setText(this.legend.get("approvals")!, String(pending));
    const first = this.samples[0];
    const span = first ? Math.round((Date.now() - first.at) / 1000) : 0;
    setText(this.scaleText, `0–${max} over the last ${span} s`);
  }
}
