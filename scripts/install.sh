#!/usr/bin/env bash
# `make install` (and `make deb`'s staging): what a built tree holds, laid out
# for PREFIX under DESTDIR (docs/INSTALL.md):
#   PREFIX/bin/moat                     the CLI (static)
#   PREFIX/sbin/moatd                   the daemon
#   PREFIX/lib/moat/moat-init           every environment's pid 1 (static; moatd finds it here)
#   PREFIX/share/moat/board/            the board's page (moatd finds it at sbin/../share/moat/board)
#   PREFIX/share/man/man{1,8}/          moat(1), moatd(8): generated from the --help texts
#   PREFIX/share/{bash-completion,zsh,fish}/...  completions
#   PREFIX/share/doc/moat/              README.md, docs/, LICENSE
#   PREFIX/lib/systemd/system/moatd.service and /etc/default/moatd (kept if present)
# Installed into the live system (no DESTDIR) as root, the group moat is made too.
# BUILD: the build tree (default build); it must be built already.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
prefix=${PREFIX:-/usr/local}
dest=${DESTDIR:-}
root="$dest$prefix"

for b in moat moatd moat-init; do
  if [ ! -x "$build/bin/$b" ]; then
    echo "install: $build/bin/$b is missing: build first (make build)" >&2
    exit 1
  fi
done
if [ ! -f "$build/share/moat/board/index.html" ]; then
  echo "install: $build/share/moat/board has no board (built without Node.js?): it is left out" >&2
fi
version=$("$build/bin/moatd" --version | sed 's/^moatd //')

install -d "$root/bin" "$root/sbin" "$root/lib/moat" "$root/share/moat" \
  "$root/share/man/man1" "$root/share/man/man8" "$root/share/doc/moat/docs" \
  "$root/share/bash-completion/completions" "$root/share/zsh/vendor-completions" \
  "$root/share/fish/vendor_completions.d" "$root/lib/systemd/system" "$dest/etc/default"
install -m 0755 "$build/bin/moat" "$root/bin/moat"
install -m 0755 "$build/bin/moatd" "$root/sbin/moatd"
install -m 0755 "$build/bin/moat-init" "$root/lib/moat/moat-init"
if [ -d "$build/share/moat/board" ]; then
  rm -rf "$root/share/moat/board"
  cp -R "$build/share/moat/board" "$root/share/moat/board"
  chmod -R u=rwX,go=rX "$root/share/moat/board"
fi

# Man pages from the help texts of the binaries just built.
man=$(mktemp -d)
trap 'rm -rf "$man"' EXIT
python3 scripts/manpage.py "$build/bin" "$man" "$version"
gzip -9n -c "$man/man1/moat.1" >"$root/share/man/man1/moat.1.gz"
gzip -9n -c "$man/man8/moatd.8" >"$root/share/man/man8/moatd.8.gz"
chmod 0644 "$root/share/man/man1/moat.1.gz" "$root/share/man/man8/moatd.8.gz"

install -m 0644 packaging/completions/moat.bash "$root/share/bash-completion/completions/moat"
ln -sf moat "$root/share/bash-completion/completions/moatd"
install -m 0644 packaging/completions/_moat "$root/share/zsh/vendor-completions/_moat"
install -m 0644 packaging/completions/moat.fish "$root/share/fish/vendor_completions.d/moat.fish"

install -m 0644 README.md LICENSE "$root/share/doc/moat/"
install -m 0644 docs/*.md "$root/share/doc/moat/docs/"

sed -e "s|@SBINDIR@|$prefix/sbin|g" -e "s|@DOCDIR@|$prefix/share/doc/moat/docs|g" packaging/moatd.service.in \
  >"$root/lib/systemd/system/moatd.service"
chmod 0644 "$root/lib/systemd/system/moatd.service"
if [ ! -e "$dest/etc/default/moatd" ]; then
  install -m 0644 packaging/moatd.default "$dest/etc/default/moatd"
fi

if [ -z "$dest" ] && [ "$(id -u)" -eq 0 ]; then
  getent group moat >/dev/null || groupadd --system moat
  echo "install: moat $version in $prefix; start it with: systemctl daemon-reload && systemctl enable --now moatd"
  echo "install: a user of moat: adduser USER moat && moat keys create --for-user USER --scope ..."
else
  echo "install: moat $version in $dest$prefix"
fi
