#!/usr/bin/env bash
# `make image`: moatd's container image (packaging/Dockerfile) from the Debian
# package of the built tree, tagged moat:VERSION and moat:latest, with
# docker or podman (IMAGE_TOOL to choose; BASE for another Debian 12 base
# image than debian:bookworm-slim). Prints the VERSION tag. docs/INSTALL.md,
# "In a container".
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
tool=${IMAGE_TOOL:-}
if [ -z "$tool" ]; then
  for candidate in docker podman; do
    if command -v "$candidate" >/dev/null && "$candidate" info >/dev/null 2>&1; then tool=$candidate; break; fi
  done
fi
if [ -z "$tool" ]; then
  echo "make image: needs docker or podman that answers (\`docker info\` or \`podman info\`)" >&2
  exit 1
fi
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
BUILD="$build" OUT="$context" scripts/make-deb.sh >/dev/null
version=$("$build/bin/moatd" --version | sed -e 's/^moatd //' -e 's/+/-/g')
flags=()
# podman builds in a chroot: no OCI runtime needed for RUN (which hosts with
# mixed cgroup v1 and v2 hierarchies refuse).
[ "$tool" = podman ] && flags+=(--isolation chroot)
[ -n "${BASE:-}" ] && flags+=(--build-arg "BASE=$BASE")
"$tool" build "${flags[@]}" -t "moat:$version" -t moat:latest -f packaging/Dockerfile "$context" >&2
echo "moat:$version"
