#!/usr/bin/env python3
"""Man pages from the binaries' own --help texts, so the two never differ.

    scripts/manpage.py BIN_DIR OUT_DIR VERSION

writes OUT_DIR/man1/moat.1 (moat --help, then each command's --help) and
OUT_DIR/man8/moatd.8 (moatd --help). The help texts are laid out for a
terminal already: they go in verbatim (.nf), escaped for roff.
"""
import re
import subprocess
import sys
import time


def run(argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        sys.exit(f"manpage: {' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def escape(text):
    lines = []
    for line in text.rstrip("\n").split("\n"):
        line = line.replace("\\", "\\e").replace("-", "\\-")
        if line.startswith((".", "'")):
            line = "\\&" + line
        lines.append(line)
    return "\n".join(lines)


def verbatim(text):
    return ".nf\n" + escape(text) + "\n.fi\n"


def page(name, section, version, summary, sections):
    date = time.strftime("%Y-%m-%d", time.gmtime(int(subprocess.run(
        ["git", "log", "-1", "--format=%ct"], capture_output=True, text=True).stdout.strip() or time.time())))
    out = [f'.TH {name.upper()} {section} "{date}" "moat {version}" "moat"',
           ".SH NAME", f"{name} \\- {summary}"]
    for title, body in sections:
        out += [f".SH {title}", verbatim(body).rstrip("\n")]
    out += [".SH SEE ALSO",
            "moat(1), moatd(8); the documentation in /usr/share/doc/moat/ "
            "(README.md and docs/, from the source repository)"]
    return "\n".join(out) + "\n"


def commands(help_text):
    """The command names moat --help lists under "commands:"."""
    names, inside = [], False
    for line in help_text.split("\n"):
        if line.startswith("commands:"):
            inside = True
            continue
        if inside:
            if not line.strip():
                break
            m = re.match(r"^  (\S+)\s", line)
            if m and m.group(1) != "version":
                names.append(m.group(1))
    return names


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    bins, out, version = sys.argv[1:]
    import os
    os.makedirs(f"{out}/man1", exist_ok=True)
    os.makedirs(f"{out}/man8", exist_ok=True)
    top = run([f"{bins}/moat", "--help"])
    sections = [("SYNOPSIS", top)]
    for command in commands(top):
        sections.append((f"COMMAND: {command.upper()}", run([f"{bins}/moat", command, "--help"])))
    with open(f"{out}/man1/moat.1", "w") as f:
        f.write(page("moat", 1, version, "environments of moatd, and one-shot sandboxes, from the command line",
                     sections))
    with open(f"{out}/man8/moatd.8", "w") as f:
        f.write(page("moatd", 8, version, "the moat daemon: isolated environments for AI agents behind an API",
                     [("SYNOPSIS", run([f"{bins}/moatd", "--help"]))]))


if __name__ == "__main__":
    main()
