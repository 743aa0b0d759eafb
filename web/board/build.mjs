// Bundles the board into the directory given as the argument: index.html,
// board.js (src/main.ts and xterm.js, minified) and board.css (src/board.css
// with xterm's stylesheet). moatd serves that directory (GET / and
// GET /board/<name>) under a Content-Security-Policy that allows scripts and
// styles from moatd only, so the output must not reference another origin.
//
//   node build.mjs OUT_DIR        (build.sh also installs and type-checks)

import { copyFileSync, mkdirSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
if (process.argv.length !== 3) {
  console.error("usage: node build.mjs OUT_DIR");
  process.exit(2);
}
const out = resolve(process.argv[2]);
mkdirSync(out, { recursive: true });

const common = {
  absWorkingDir: here,
  bundle: true,
  minify: true,
  legalComments: "none",
  logLevel: "warning",
  outdir: out,
};
await esbuild.build({
  ...common,
  entryPoints: { board: "src/main.ts" },
  format: "iife",
  target: ["es2022"],
  platform: "browser",
});
await esbuild.build({ ...common, entryPoints: { board: "src/board.css" } });
copyFileSync(join(here, "src", "index.html"), join(out, "index.html"));

// What the page loads must come from moatd: no http(s) URL in the markup or
// the stylesheet (the script holds namespace URIs such as SVG's, which load
// nothing).
for (const name of ["index.html", "board.css"]) {
  const text = readFileSync(join(out, name), "utf8");
  const m = /(?:https?:)?\/\/[a-z0-9.-]+\.[a-z]{2,}/i.exec(text);
  if (m) {
    console.error(`build.mjs: ${name} references another origin (${m[0]})`);
    process.exit(1);
  }
}
