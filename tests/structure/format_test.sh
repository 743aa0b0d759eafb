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
bad=0
count=0
for f in $(git ls-files 'src/*.cc' 'src/*.h' 'tests/*.cc' 'tests/*.h' 'bench/*.cc' 'fuzz/*.cc' 2>/dev/null ||
           find src tests bench fuzz -name '*.cc' -o -name '*.h' | grep -v node_modules); do
  count=$((count + 1))
  if ! "$cf" --style=file "$f" | cmp -s - "$f"; then
    echo "FAIL: $f is not as clang-format lays it out (make format)"
    bad=$((bad + 1))
  fi
done
echo "$count files checked; $bad differ"
[ "$bad" -eq 0 ]
