#!/usr/bin/env bash
# Installs the Debian packages moat needs to build, test and benchmark, if
# any are missing. Safe to run repeatedly; does nothing when all are there.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config   # toolchain
  libgtest-dev libseccomp-dev                    # libraries
  libboost-dev nlohmann-json3-dev                # moatd: HTTP (Beast/Asio), JSON
  libsqlite3-dev libssl-dev                      # moatd: the store, API key hashing
  publicsuffix                                   # moatd: checks secrets' host globs
  btrfs-progs                                    # mkfs.btrfs for the storage pool
  python3                                        # used by tests inside environments
  bubblewrap util-linux                          # peers in bench/ (bwrap, unshare)
  python3-yaml python3-jsonschema                # tests/api: OpenAPI conformance
  clang libclang-rt-dev llvm                     # fuzz/: libFuzzer, sanitizers, llvm-symbolizer
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done

# Node.js >= 20 and npm, for the TypeScript SDK (sdk/typescript) only: its
# test (sdk.typescript) is skipped without them, so they never fail the
# install. Debian's nodejs and npm are installed only when there is no node
# at all: a node from elsewhere (NodeSource, nvm) brings its own npm, and
# Debian's npm would pull its older nodejs over it.
want_node=false
command -v node >/dev/null 2>&1 || want_node=true

node_note() {
  if ! command -v node >/dev/null 2>&1; then
    echo "install-deps: note: Node.js is not installed; the TypeScript SDK (sdk/typescript)" \
         "needs Node.js >= 20 and npm, and its test sdk.typescript is skipped without them" >&2
    return 0
  fi
  local major
  major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
  if [ "$major" -lt 20 ] 2>/dev/null; then
    echo "install-deps: note: Node.js $(node --version 2>/dev/null) is too old for the TypeScript SDK" \
         "(sdk/typescript needs >= 20; Debian 12 ships 18). Install Node.js 20 or later" \
         "(nodejs.org, NodeSource); until then the sdk.typescript test is skipped" >&2
  elif ! command -v npm >/dev/null 2>&1; then
    echo "install-deps: note: npm is missing; the TypeScript SDK (sdk/typescript) needs it" \
         "and its test sdk.typescript is skipped without it" >&2
  fi
}

if [ ${#missing[@]} -eq 0 ] && ! $want_node; then
  node_note
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  if [ ${#missing[@]} -eq 0 ]; then
    node_note
    exit 0
  fi
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root (or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if $want_node; then
  echo "install-deps: installing nodejs npm (for the TypeScript SDK)"
  apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null ||
    echo "install-deps: note: could not install nodejs and npm; the TypeScript SDK's test is skipped" >&2
fi
node_note
