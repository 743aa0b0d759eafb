#!/usr/bin/env bash
# `make deb`: a Debian package of the built tree (docs/INSTALL.md), written to
# OUT (default: the current directory) as moat_VERSION_ARCH.deb. Staged by
# scripts/install.sh with PREFIX=/usr; the maintainer scripts make the group
# moat (postinst) and stop moatd on removal (prerm).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
out=${OUT:-.}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

chmod 0755 "$stage"
DESTDIR="$stage" PREFIX=/usr BUILD="$build" scripts/install.sh >/dev/null
# No debug sections in the package (the build tree keeps them, -g1).
strip --strip-unneeded "$stage/usr/bin/moat" "$stage/usr/sbin/moatd" "$stage/usr/lib/moat/moat-init"
# Debian's names: the license as the copyright file, the unit where systemd
# and dh put it.
mv "$stage/usr/share/doc/moat/LICENSE" "$stage/usr/share/doc/moat/copyright"

# moatd 0.1.0+333b9a4-dirty -> 0.1.0+333b9a4.dirty (a "-" would start a Debian revision)
version=$("$build/bin/moatd" --version | sed -e 's/^moatd //' -e 's/-/./g')
arch=$(dpkg --print-architecture)
size=$(du -sk "$stage" | cut -f1)
mkdir -p "$stage/DEBIAN"
sed -e "s|@VERSION@|$version|" -e "s|@ARCH@|$arch|" -e "s|@SIZE@|$size|" packaging/debian/control.in \
  >"$stage/DEBIAN/control"
echo /etc/default/moatd >"$stage/DEBIAN/conffiles"
install -m 0755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$stage/DEBIAN/"
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -print0 | sort -z | xargs -0 md5sum | sed 's| \./| |') \
  >"$stage/DEBIAN/md5sums"
mkdir -p "$out"
deb="$out/moat_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "$deb"
