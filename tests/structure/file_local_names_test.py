#!/usr/bin/env python3
"""File-local names are unique where files are compiled together.

`make build` compiles each target as a unity build (CMAKE_UNITY_BUILD: a
few .cc files pasted into one translation unit, which takes the build from
~11 to ~4 minutes here). There, what one file keeps to itself (its
anonymous namespace, its `static` functions) is seen by the files after it
in the same batch. Two such names that are the same thing with different
signatures would not fail to compile: a call could quietly reach the other
file's overload. So a file-local function, type, constant or variable may
not share its name with one of another .cc file of the same group (src/,
or one test directory), nor with a name another file of the group declares
at namespace scope (in an anonymous namespace, a file-local `parse` hides
the namespace's `parse` from the files pasted after it). Aliases (`using X = ...;`, `namespace x = ...;`)
are left out: the compiler refuses two of them that differ.

  tests/structure/file_local_names_test.py --source-dir .
"""

import argparse
import collections
import os
import re
import sys

# Groups whose files can land in one unity batch; bench/ and fuzz/ build one
# file per executable, so nothing of theirs is pasted together.
GROUPS = ["src", "tests/support", "tests/unit", "tests/integration", "tests/security"]
# Not in any batch: each is its own executable's only file.
ALONE = {"src/daemon/main.cc", "src/cli/main.cc", "src/init/main.cc", "src/isolation/seccomp/compile_main.cc",
         "tests/integration/run_test.cc", "tests/integration/guest_tool.cc", "tests/security/probe.cc"}
IGNORED = {"TEST", "TEST_F", "TEST_P", "INSTANTIATE_TEST_SUITE_P", "operator"}


def strip(text):
    """The text without comments, literals and preprocessor lines."""
    text = re.sub(r'R"(\w*)\(.*?\)\1"', '""', text, flags=re.S)
    text = re.sub(r"(?<=[0-9A-Fa-f])'(?=[0-9A-Fa-f])", "", text)  # digit separators (60'000) are no literals
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            i = text.find("*/", i + 2)
            i = n if i < 0 else i + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    lines = "".join(out).split("\n")
    kept, continued = [], False
    for line in lines:
        directive = continued or line.lstrip().startswith("#")
        continued = directive and line.rstrip().endswith("\\")
        kept.append("" if directive else line)
    return "\n".join(kept)


def without_template_head(stmt):
    m = re.match(r"\s*template\s*<", stmt)
    if not m:
        return stmt
    depth, i = 1, m.end()
    while i < len(stmt) and depth:
        depth += {"<": 1, ">": -1}.get(stmt[i], 0)
        i += 1
    return without_template_head(stmt[i:])


def declared_name(stmt):
    """The name a namespace-scope declaration declares, or None."""
    stmt = without_template_head(" ".join(stmt.split()))
    if not stmt or re.match(r"(using|namespace|friend|typedef|extern|static_assert)\b", stmt):
        return None
    m = re.match(r"(?:struct|class|union|enum(?:\s+class)?)\s+(?:\[\[[^\]]*\]\]\s*)?(\w+)", stmt)
    if m:
        return m.group(1)
    paren, eq = stmt.find("("), stmt.find("=")
    head = stmt[:eq] if eq >= 0 and (paren < 0 or eq < paren) else stmt[:paren] if paren >= 0 else stmt
    head = re.sub(r"\[[^\]]*\]\s*$", "", head.strip())  # an array's bound
    if re.search(r"::\s*~?\w+\s*$", head):
        return None  # a member's or a namespace's name, declared elsewhere
    names = re.findall(r"\w+", head)
    return names[-1] if names else None


def declared_names(text):
    """(file-local, public): the names ("::moat::x::name") a file declares in
    anonymous namespaces or `static` at namespace scope, and the others it
    declares at namespace scope. Names in different namespaces do not meet."""
    text, names, public = strip(text), [], []

    def declare(head, anonymous, namespace):
        local = anonymous or head.startswith("static ")
        name = declared_name(head)
        if name and name not in IGNORED:
            (names if local else public).append(f"{namespace}::{name}")

    def scope(i, anonymous, namespace):
        stmt = ""
        while i < len(text):
            c = text[i]
            if c == "{":
                head = stmt.strip()
                m = re.search(r'(?:^|\s)namespace(\s+[\w:]+)?\s*$|^extern\s*""\s*$', head)
                if m:
                    inner = (m.group(1) or "").strip()
                    i = scope(i + 1, anonymous or (head.startswith("namespace") and not inner),
                              f"{namespace}::{inner}" if inner else namespace)
                else:
                    declare(head, anonymous, namespace)
                    depth, i = 1, i + 1
                    while i < len(text) and depth:
                        depth += {"{": 1, "}": -1}.get(text[i], 0)
                        i += 1
                    # `struct X {...} x;` and `T x{...};`: what follows the body ends it
                    if re.match(r"(struct|class|union|enum)\b", head) or not re.search(r"\)[^()]*$", head):
                        m = re.match(r"[\w\s,*&]*;", text[i:])
                        i += m.end() if m else 0
                    stmt = ""
                    continue
                stmt = ""
            elif c == "}":
                return i + 1
            elif c == ";":
                declare(stmt.strip(), anonymous, namespace)
                stmt = ""
            else:
                stmt += c
            i += 1
        return i

    scope(0, False, "")
    return set(names), set(public)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()
    failures = []
    for group in GROUPS:
        where, public = collections.defaultdict(list), collections.defaultdict(list)
        root = os.path.join(args.source_dir, group)
        for dirpath, _, files in os.walk(root):
            for f in sorted(files):
                rel = os.path.relpath(os.path.join(dirpath, f), args.source_dir)
                if not f.endswith(".cc") or rel in ALONE:
                    continue
                with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                    local, shared = declared_names(fh.read())
                for name in local:
                    where[name].append(rel)
                for name in shared:
                    public[name].append(rel)
        for name, files in sorted(where.items()):
            if len(files) > 1:
                failures.append(f"{group}: file-local name '{name}' in {', '.join(sorted(files))}")
            others = sorted(set(public.get(name, [])) - set(files))
            if others:
                failures.append(f"{group}: file-local name '{name}' in {', '.join(sorted(files))} hides the one "
                                f"{', '.join(others)} declares")
    for f in failures:
        print("FAIL:", f)
    if failures:
        print(f"{len(failures)} file-local names repeat where a unity build pastes files together: give each a name "
              "of its own (or share one definition from a header)")
        return 1
    print("file-local names: unique in each group")
    return 0


if __name__ == "__main__":
    sys.exit(main())
