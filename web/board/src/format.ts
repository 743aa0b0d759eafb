// Numbers, times and commands as the board writes them (plain strings: the
// callers put them in text nodes).

export function bytes(n: number): string {
  if (!Number.isFinite(n)) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${u === 0 ? v : v.toFixed(v < 10 ? 1 : 0)} ${units[u]}`;
}

/** 42s, 5m, 3h 20m, 2d 4h. */
export function duration(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h ${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

/** HH:MM:SS in local time. */
export function clock(iso: string | number): string {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toLocaleTimeString([], { hour12: false });
}

export function dateTime(iso: string | number): string {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return `${d.toLocaleDateString()} ${d.toLocaleTimeString([], { hour12: false })}`;
}

/** One argument as a shell would need it quoted (for reading, not for running). */
function shellWord(s: string): string {
  if (s !== "" && /^[A-Za-z0-9_@%+=:,./-]+$/.test(s)) return s;
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

export function argvLine(argv: unknown): string {
  if (!Array.isArray(argv)) return "";
  return argv.map((a) => shellWord(String(a))).join(" ");
}

/** Text cut to `max` characters, with an ellipsis when cut. */
export function cut(s: string, max: number): string {
  return s.length <= max ? s : `${s.slice(0, max - 1)}…`;
}

export function percent(x: number): string {
  if (!Number.isFinite(x)) return "?";
  return `${x < 10 ? x.toFixed(1) : Math.round(x)}%`;
}

/** `k=v` for each label, in key order. */
export function labelPairs(labels: Record<string, string> | undefined): string[] {
  if (!labels) return [];
  return Object.keys(labels)
    .sort()
    .map((k) => `${k}=${labels[k]}`);
}
