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
  clang-format                                   # make format; tests/structure checks the layout
  chromium                                       # tests/board: the board in a real (headless) browser
  skopeo umoci                                   # templates from OCI images (docs/TEMPLATES.md)
  lxcfs                                          # /proc inside shows the environment's limits
  python3-pytest                                 # sdk/python's tests
  qemu-system-x86 erofs-utils                    # microVMs: the VMM, root file system images
  linux-image-cloud-amd64                        # microVMs: the guest kernel (virtio drivers as modules)
  busybox-static                                 # tests/api: a microVM template with a shell and tools
  systemd groff-base                             # tests/packaging: systemd-analyze verify, man pages checked
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done

# Node.js >= 20 and npm: the MCP tier (the official MCP SDK client) and the
# TypeScript SDK's test need them, and `make test` runs both. Debian 12's
# nodejs is 18, so a node older than 20 is replaced by the one the npm
# registry carries (the `node` package holds the binary; npm puts it in
# /usr/local/bin). Debian's nodejs and npm come first only when there is no
# npm at all (a node from elsewhere, nvm say, brings its own).
node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
want_node=false
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1 || [ "$(node_major)" -lt 20 ]; then
  want_node=true
fi

node_check() {
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1 || [ "$(node_major)" -lt 20 ]; then
    echo "install-deps: Node.js >= 20 and npm are needed by the MCP and TypeScript SDK tests" \
         "(found: $(node --version 2>/dev/null || echo 'no node'), $(npm --version 2>/dev/null || echo 'no npm'))" >&2
    return 1
  fi
}

if [ ${#missing[@]} -eq 0 ] && ! $want_node; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  if [ ${#missing[@]} -eq 0 ]; then
    # Not root: nothing can be installed; those two tiers skip (exit 77).
    node_check || echo "install-deps: note: as root, make installs it" >&2
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
  if ! command -v npm >/dev/null 2>&1; then
    echo "install-deps: installing nodejs npm (Debian's, to fetch a newer node with)"
    apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
  if [ "$(node_major)" -lt 20 ]; then
    echo "install-deps: installing node@20 from the npm registry (this node is $(node --version 2>/dev/null))"
    npm install -g --no-audit --no-fund --loglevel=error node@20
    hash -r
  fi
  node_check
fi
