#!/usr/bin/env bash
# Installs the Debian packages moat needs to build, test and benchmark, if
# any are missing. Safe to run repeatedly; does nothing when all are there.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config   # toolchain
  libgtest-dev libseccomp-dev                    # libraries
  libboost-dev nlohmann-json3-dev                # moatd: HTTP (Beast/Asio), JSON
  libsqlite3-dev libssl-dev                      # moatd: the store, API key hashing
  btrfs-progs                                    # mkfs.btrfs for the storage pool
  python3                                        # used by tests inside environments
  bubblewrap util-linux                          # peers in bench/ (bwrap, unshare)
  python3-yaml python3-jsonschema                # tests/api: OpenAPI conformance
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root (or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
