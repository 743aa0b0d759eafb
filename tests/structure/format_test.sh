#!/bin/sh
# The C++ sources as .clang-format lays them out (clang-format 14, Debian
# 12's: other versions lay out some constructs differently). `make format`
# rewrites them; this fails naming each file that differs.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cf=$(command -v clang-format-14 || true)
if [ -z "$cf" ]; then
  cf=$(command -v clang-format || true)
  if [ -z "$cf" ] || ! "$cf" --version | grep -q 'version 14\.'; then
    echo "SKIP: needs clang-format 14 (scripts/install-deps.sh installs it)"
    exit 77
  fi
fi
cd "$root"
files=$(git ls-files 'src/*.cc' 'src/*.h' 'tests/*.cc' 'tests/*.h' 'bench/*.cc' 'fuzz/*.cc' 2>/dev/null ||
        find src tests bench fuzz -name '*.cc' -o -name '*.h' | grep -v node_modules)
count=$(echo "$files" | wc -w)
# One clang-format for every file (one per file took a minute on 2 busy
# cores): --dry-run names each place that differs.
# shellcheck disable=SC2086
report=$("$cf" --style=file --dry-run $files 2>&1 || true)
differ=$(echo "$report" | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: warning: code should be clang-formatted.*/\1/p' | sort -u)
other=$(echo "$report" | grep -E '^[^ ]+:[0-9]+:[0-9]+: error' || true)
if [ -n "$other" ]; then
  echo "FAIL: clang-format could not read every file:"
  echo "$other"
  exit 1
fi
bad=0
for f in $differ; do
  echo "FAIL: $f is not as clang-format lays it out (make format)"
  bad=$((bad + 1))
done
echo "$count files checked; $bad differ"
[ "$bad" -eq 0 ]
