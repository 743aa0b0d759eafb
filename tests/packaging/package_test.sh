#!/usr/bin/env bash
# packaging.install_and_deb: scripts/install.sh and scripts/make-deb.sh on the
# built tree BUILD (the first argument), checked from the outside.
set -Eeuo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
work=$(mktemp -d /tmp/moat-package-test-XXXXXX)
moatd_pid=
cleanup() {
  if [ -n "$moatd_pid" ]; then kill "$moatd_pid" 2>/dev/null || true; wait "$moatd_pid" 2>/dev/null || true; fi
  # A stopped moatd keeps its storage pool and egress namespace mounted
  # (for the next one on the same state): the test's own go with it.
  awk -v w="$work" '$5 ~ "^" w { print $5 }' /proc/self/mountinfo | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
# A command that ends the script under set -e says which it was.
trap 'echo "FAIL: line $LINENO: \"$BASH_COMMAND\" exited $?"' ERR
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# A check's pipeline is judged by its last command (no pipefail there): a
# `grep -q` that matches and leaves early must not turn its writer's
# SIGPIPE into the check's answer.
check() { if ! (set +o pipefail; eval "$1"); then fail "$2"; fi; }

for tool in dpkg-deb systemd-analyze groff python3 strip; do
  if ! command -v "$tool" >/dev/null; then
    if [ -n "${MOAT_CI:-}" ]; then fail "$tool is missing (scripts/install-deps.sh installs it)"; exit 1; fi
    echo "SKIP: needs $tool"; exit 77
  fi
done
version=$("$build/bin/moatd" --version | sed 's/^moatd //')

# --- make install into a DESTDIR ------------------------------------------
dest="$work/dest"
BUILD="$build" DESTDIR="$dest" PREFIX=/usr/local "$src/scripts/install.sh" >"$work/install.log"
root="$dest/usr/local"
for f in bin/moat sbin/moatd lib/moat/moat-init; do
  check "[ -x '$root/$f' ]" "$f not installed executable"
done
for f in share/man/man1/moat.1.gz share/man/man8/moatd.8.gz share/doc/moat/README.md share/doc/moat/LICENSE \
         share/doc/moat/docs/API.md share/doc/moat/docs/INSTALL.md share/bash-completion/completions/moat \
         share/zsh/vendor-completions/_moat share/fish/vendor_completions.d/moat.fish \
         lib/systemd/system/moatd.service share/moat/board/index.html; do
  check "[ -f '$root/$f' ]" "$f not installed"
done
check "[ -f '$dest/etc/default/moatd' ]" "/etc/default/moatd not installed"
check "[ \"\$('$root/bin/moat' --version)\" = 'moat $version' ]" "the installed moat is not this build's"
check "grep -q '^ExecStart=/usr/local/sbin/moatd --socket-group moat' '$root/lib/systemd/system/moatd.service'" \
  "the unit does not start the installed moatd"
# A second install keeps an /etc/default/moatd that was edited.
echo 'MOATD_OPTS="--max-environments 3"' >"$dest/etc/default/moatd"
BUILD="$build" DESTDIR="$dest" PREFIX=/usr/local "$src/scripts/install.sh" >/dev/null
check "grep -q 'max-environments 3' '$dest/etc/default/moatd'" "a reinstall overwrote /etc/default/moatd"

# Man pages: every command's help is in moat(1); groff finds nothing wrong.
for page in man1/moat.1.gz man8/moatd.8.gz; do
  warnings=$(zcat "$root/share/man/$page" | LC_ALL=C.UTF-8 groff -man -Tutf8 -ww -z 2>&1 || echo "groff failed")
  check "[ -z \"\$warnings\" ]" "$page: $warnings"
done
# (awk reads to the end: a reader that leaves early kills the writer with
# SIGPIPE when it is slower, and pipefail ends the script.)
commands=$("$build/bin/moat" --help | awk '/^commands:/ { i = 1; next } i && /^$/ { i = 0 } i && /^  [a-z]/ { print $1 }')
for c in $commands; do
  [ "$c" = version ] && continue
  check "zcat '$root/share/man/man1/moat.1.gz' | grep -q '^.SH COMMAND: ${c^^}\$'" "moat(1) lacks the command $c"
done
check "zcat '$root/share/man/man8/moatd.8.gz' | grep -q 'socket\\\\-group'" "moatd(8) lacks --socket-group"

# Completions: bash's completes commands, subcommands and flags from --help.
bash -n "$root/share/bash-completion/completions/moat" || fail "the bash completion does not parse"
complete_words() {
  PATH="$root/bin:$root/sbin:$PATH" bash -c '
    source "$1"; shift
    COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _${1}
    printf "%s\n" "${COMPREPLY[@]}"' _ "$root/share/bash-completion/completions/moat" "$@"
}
check "complete_words moat e | grep -qx env" "bash: moat e<TAB> does not offer env"
check "complete_words moat env c | grep -qx create" "bash: moat env c<TAB> does not offer create"
check "complete_words moat cp --no | grep -qx -- --no-progress" "bash: moat cp --no<TAB> does not offer --no-progress"
check "complete_words moatd --socket | grep -qx -- --socket-group" "bash: moatd --socket<TAB> does not offer --socket-group"
if command -v zsh >/dev/null; then zsh -n "$root/share/zsh/vendor-completions/_moat" || fail "_moat does not parse"; fi
if command -v fish >/dev/null; then fish -n "$root/share/fish/vendor_completions.d/moat.fish" || fail "moat.fish does not parse"; fi

# --- make deb --------------------------------------------------------------
deb=$(BUILD="$build" OUT="$work/out" "$src/scripts/make-deb.sh")
check "[ -f '$deb' ]" "make-deb wrote no package"
info=$(dpkg-deb -f "$deb" Package Version Architecture Depends)
check "echo \"\$info\" | grep -qx 'Package: moat'" "Package field"
check "echo \"\$info\" | grep -qx 'Version: ${version//-/.}'" "Version field: $info"
check "[ \"\$(dpkg-deb --ctrl-tarfile '$deb' | tar -xO ./conffiles)\" = /etc/default/moatd ]" "conffiles"
listing=$(dpkg-deb -c "$deb")
for f in ./usr/bin/moat ./usr/sbin/moatd ./usr/lib/moat/moat-init ./usr/lib/systemd/system/moatd.service \
         ./etc/default/moatd ./usr/share/doc/moat/copyright ./usr/share/man/man8/moatd.8.gz \
         ./usr/share/moat/board/index.html; do
  check "echo \"\$listing\" | grep -q ' $f\$'" "the package lacks $f"
done
check "! echo \"\$listing\" | grep -v ' root/root ' | grep -q ." "a file in the package is not root's"
check "! echo \"\$listing\" | grep -q '^d......... root/root .* \\./\$' || echo \"\$listing\" | grep -q '^drwxr-xr-x root/root .* \\./\$'" \
  "the package's / is not 0755"
pkg="$work/pkg"
dpkg-deb -x "$deb" "$pkg"
dpkg-deb -e "$deb" "$pkg/DEBIAN"
for s in postinst prerm postrm; do
  check "[ -x '$pkg/DEBIAN/$s' ] && sh -n '$pkg/DEBIAN/$s'" "maintainer script $s"
done
check "! readelf -S '$pkg/usr/sbin/moatd' | grep -q debug_info" "moatd is packaged with its debug sections"
# Every shared library moatd needs comes from a package the control file depends on.
depends=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed -E 's/^ *([^ ]+).*/\1/')
libraries=$(ldconfig -p)
for lib in $(readelf -d "$pkg/usr/sbin/moatd" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
  path=$(awk -v l="$lib" '$1 == l && /x86-64/ { print $NF; exit }' <<<"$libraries")
  owner=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -1 | cut -d: -f1 || true)
  [ -z "$owner" ] && owner=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1 || true)
  check "echo \"\$depends\" | grep -qx '$owner'" "moatd needs $lib ($owner), which Depends does not name"
done

# The unit, as systemd reads it, against the packaged tree.
vroot="$work/vroot"
mkdir -p "$vroot/usr/lib/systemd"
cp -a /usr/lib/systemd/system "$vroot/usr/lib/systemd/"
cp -a "$pkg/usr/sbin" "$vroot/usr/"
cp "$pkg/usr/lib/systemd/system/moatd.service" "$vroot/usr/lib/systemd/system/"
verify=$(systemd-analyze verify --man=no --root="$vroot" /usr/lib/systemd/system/moatd.service 2>&1) ||
  fail "systemd-analyze verify failed"
check "[ -z \"\$verify\" ]" "systemd-analyze verify: $verify"

# --- the packaged moatd serves an environment ------------------------------
if [ "$(id -u)" -ne 0 ]; then
  if [ -n "${MOAT_CI:-}" ]; then fail "CI runs as root: the packaged moatd was not started"; fi
  echo "SKIP (part): starting the packaged moatd needs root"
else
  state="$work/state"
  "$pkg/usr/sbin/moatd" --state "$state" --listen 127.0.0.1:0 >"$work/moatd.log" 2>&1 &
  moatd_pid=$!
  # Until it says it serves (its first start makes the storage pool: seconds
  # on a busy machine), or it has ended.
  for _ in $(seq 1 1200); do
    grep -q "moatd: serving" "$work/moatd.log" 2>/dev/null && break
    kill -0 "$moatd_pid" 2>/dev/null || break
    sleep 0.05
  done
  grep -q "moatd: serving" "$work/moatd.log" || fail "the packaged moatd did not start: $(tail -3 "$work/moatd.log")"
  id=$(MOAT_STATE="$state" "$pkg/usr/bin/moat" env create | cut -c1-12)
  out=$(MOAT_STATE="$state" "$pkg/usr/bin/moat" exec "$id" -- cat /proc/1/comm 2>&1 || true)
  check "[ \"\$out\" = moat-init ]" "the packaged moatd's environment: pid 1 is '$out' ($(tail -3 "$work/moatd.log"))"
  board=$(python3 - "$state/moatd.sock" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
data = b""
while chunk := s.recv(65536): data += chunk
print(data.split(b"\r\n", 1)[0].decode())
PY
)
  check "[ \"\$board\" = 'HTTP/1.1 200 OK' ]" "the packaged moatd serves no board at / ($board)"
  kill -TERM "$moatd_pid"
  wait "$moatd_pid" || fail "the packaged moatd did not stop cleanly"
  moatd_pid=
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures failed"
  exit 1
fi
echo "ok: install, man pages, completions, the package, its unit and its moatd"
