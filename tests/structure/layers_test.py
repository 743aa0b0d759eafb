#!/usr/bin/env python3
"""docs/ARCHITECTURE.md's code map and dependency table against the tree:

- every directory under src/ is in the code map, and every directory the
  map names exists;
- every `#include "DIR/..."` in src/ is one the dependency table allows
  for the including directory (dependencies point down; a new edge is a
  decision made in the doc first).

  tests/structure/layers_test.py --source-dir .
"""

import argparse
import os
import re
import sys


def table_rows(text, heading):
    """The rows (lists of cells) of the first table after `heading`."""
    at = text.find(heading)
    if at < 0:
        sys.exit(f"FAIL: docs/ARCHITECTURE.md has no '{heading}' section")
    rows = []
    for line in text[at:].splitlines()[1:]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set(cells[0]) <= set("-: "):
                rows.append(cells)
        elif rows:
            break
    return rows[1:]  # without the header


def dirs_in(cell):
    return re.findall(r"`src/([a-z_]+)`|`([a-z_]+)`", cell)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()
    src = os.path.join(args.source_dir, "src")
    with open(os.path.join(args.source_dir, "docs", "ARCHITECTURE.md")) as f:
        doc = f.read()
    failures = []

    tree = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    mapped = {m[0] for row in table_rows(doc, "## Code map") for m in dirs_in(row[0]) if m[0]}
    for d in tree:
        if d not in mapped:
            failures.append(f"src/{d} is not in the code map")
    for d in mapped - set(tree):
        failures.append(f"the code map names src/{d}, which does not exist")

    allowed = {}
    for row in table_rows(doc, "## Dependencies"):
        names = [m[0] or m[1] for m in dirs_in(row[0])]
        uses = {m[0] or m[1] for m in dirs_in(row[1])}
        for n in names:
            allowed[n] = uses
    include = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')
    edges = 0
    for d in tree:
        if d not in allowed:
            failures.append(f"src/{d} has no row in the dependency table")
            continue
        for root, _, files in os.walk(os.path.join(src, d)):
            for name in files:
                path = os.path.join(root, name)
                with open(path, errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = include.match(line)
                        if not m or m.group(1) == d or not os.path.isdir(os.path.join(src, m.group(1))):
                            continue
                        edges += 1
                        if m.group(1) not in allowed[d]:
                            rel = os.path.relpath(path, args.source_dir)
                            failures.append(f"{rel}:{n}: src/{d} includes src/{m.group(1)}, "
                                            f"which the dependency table does not allow")
    for f in failures:
        print("FAIL:", f)
    print(f"{len(tree)} directories, {edges} includes across them checked; {len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
