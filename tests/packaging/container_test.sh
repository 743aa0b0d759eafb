#!/usr/bin/env bash
# make test-container: moatd's image (scripts/make-image.sh,
# packaging/Dockerfile) built with podman from the built tree BUILD (the
# first argument) on a Debian 12 base made here by debootstrap (no registry
# needed), then checked: its entrypoint, volume, port and stop signal, and
# moatd from it serving an environment whose root is the image's.
#
# It runs the image with `podman run --privileged` where the host lets it;
# where the OCI runtime cannot start a container (crun and runc both refuse
# on hosts without CAP_SYS_RESOURCE or with mixed cgroup v1 and v2, as the
# VM this was written on), it says so and runs the image's root file system
# itself, in a mount namespace of its own under pivot_root, as a runtime
# would. Root; not in `make test` (debootstrap and the package mirror: a
# minute or two).
set -Eeuo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
base=localhost/moat-test-base:bookworm
work=$(mktemp -d /tmp/moat-container-test-XXXXXX)
container=moat-container-test-$$
image=
cleanup() {
  podman rm -f "$container" >/dev/null 2>&1 || true
  if [ -n "$image" ]; then
    podman image umount "$image" >/dev/null 2>&1 || true
    podman rmi "$image" >/dev/null 2>&1 || true  # moat:latest keeps the last one built
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "FAIL: line $LINENO: \"$BASH_COMMAND\" exited $?"' ERR
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root (podman, debootstrap, namespaces)"; exit 77; fi
for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is missing (make test-container installs it)"; exit 1; }
done

# The base: Debian 12's minimal system, made once and kept in podman's store.
if ! podman image exists "$base"; then
  debootstrap --variant=minbase bookworm "$work/base" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 ||
    { tail -5 "$work/debootstrap.log"; fail "debootstrap"; exit 1; }
  tar -C "$work/base" -c . | podman import - "$base" >"$work/import.log" 2>&1 ||
    { tail -5 "$work/import.log"; fail "podman import"; exit 1; }
  rm -rf "$work/base"
fi

image=$(BUILD="$build" BASE="$base" IMAGE_TOOL=podman "$src/scripts/make-image.sh" 2>"$work/build.log") ||
  { tail -20 "$work/build.log"; fail "make-image"; exit 1; }
version=$("$build/bin/moatd" --version | sed -e 's/^moatd //' -e 's/+/-/g')
[ "$image" = "moat:$version" ] || fail "the image is tagged $image, not moat:$version"
config=$(podman image inspect "$image" --format '{{json .Config}}')
check_config() {
  python3 -c 'import json, sys; c = json.loads(sys.argv[1]); sys.exit(0 if eval(sys.argv[2]) else 1)' "$config" "$1" ||
    fail "image config: $2 ($config)"
}
check_config 'c["Entrypoint"] == ["/usr/sbin/moatd", "--state", "/var/lib/moat"]' "entrypoint"
check_config 'c["Cmd"] == ["--listen", "0.0.0.0:7070"]' "command"
check_config '"/var/lib/moat" in c.get("Volumes", {})' "the state volume"
check_config '"7070/tcp" in c.get("ExposedPorts", {})' "the port"
check_config 'c.get("StopSignal") == "SIGTERM"' "the stop signal"

root=$(podman image mount "$image")
imaged=$(cat "$root/etc/debian_version")
# apt installed the package on a fresh Debian 12: its postinst made the
# group, dpkg knows every file.
grep -q '^moat:x:[0-9]*:' "$root/etc/group" || fail "the package's postinst made no group moat in the image"
for f in /usr/bin/moat /usr/sbin/moatd /usr/lib/moat/moat-init /usr/share/moat/board/index.html; do
  grep -qx "$f" "$root/var/lib/dpkg/info/moat.list" || fail "dpkg does not list $f as the package's"
  [ -e "$root$f" ] || fail "$f is not in the image"
done
served() {
  local log=$1
  grep -q "moatd: serving" "$log" 2>/dev/null
}
mkdir -p "$work/state"
if podman run -d --name "$container" --privileged --cgroupns=host -v "$work/state:/var/lib/moat" "$image" \
  >"$work/run.log" 2>&1; then
  for _ in $(seq 1 600); do
    podman logs "$container" >"$work/moatd.log" 2>&1 || true
    served "$work/moatd.log" && break
    sleep 0.1
  done
  served "$work/moatd.log" || fail "moatd in the container did not serve: $(tail -3 "$work/moatd.log")"
  id=$(podman exec "$container" moat env create | cut -c1-12)
  out=$(podman exec "$container" moat exec "$id" -- sh -c 'cat /proc/1/comm /etc/debian_version' 2>&1 || true)
  [ "$out" = "moat-init"$'\n'"$imaged" ] || fail "an environment in the container: pid 1 and the image's root ($out)"
  podman stop -t 30 "$container" >/dev/null
  [ "$(podman inspect "$container" --format '{{.State.ExitCode}}')" = 0 ] || fail "moatd did not stop cleanly"
else
  echo "NOTE: podman run cannot start a container here ($(tail -1 "$work/run.log")):" \
    "the image's root runs in a mount namespace of its own under pivot_root instead"
  # Its own pid namespace too: what moatd leaves running (lxcfs) ends with
  # it, and with the last of them the mounts (the storage pool's loop device).
  unshare --mount --pid --fork bash -s "$root" "$work/state" >"$work/moatd.log" 2>&1 <<'RUN' || true
set -e
root=$1 state=$2
mount --make-rprivate /
r=$(mktemp -d /tmp/moat-container-root-XXXXXX)
mount --bind "$root" "$r"
mount --rbind /dev "$r/dev"; mount -t proc proc "$r/proc"; mount --rbind /sys "$r/sys"
mount -t tmpfs tmpfs "$r/run"; mount -t tmpfs tmpfs "$r/tmp"; mount -t tmpfs tmpfs "$r/mnt"
mount --bind "$state" "$r/var/lib/moat"
mkdir "$r/mnt/old"
cd "$r"
pivot_root . mnt/old
exec /bin/sh -c '
umount -l /mnt/old
/usr/sbin/moatd --state /var/lib/moat --listen 127.0.0.1:0 &
pid=$!
for i in $(seq 1 600); do [ -S /var/lib/moat/moatd.sock ] && moat env ls >/dev/null 2>&1 && break; sleep 0.1; done
id=$(moat env create | cut -c1-12)
echo "pid 1: $(moat exec "$id" -- cat /proc/1/comm)"
echo "debian: $(moat exec "$id" -- cat /etc/debian_version)"
kill -TERM $pid; wait $pid; echo "moatd ended: $?"'
RUN
  rmdir /tmp/moat-container-root-* 2>/dev/null || true
  served "$work/moatd.log" || fail "moatd from the image did not serve: $(tail -3 "$work/moatd.log")"
  grep -qx "pid 1: moat-init" "$work/moatd.log" || fail "an environment from the image: $(tail -3 "$work/moatd.log")"
  grep -qx "debian: $imaged" "$work/moatd.log" || fail "the environment's root is not the image's ($imaged)"
  grep -qx "moatd ended: 0" "$work/moatd.log" || fail "moatd from the image did not stop cleanly: $(tail -3 "$work/moatd.log")"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures failed"
  exit 1
fi
echo "ok: $image (entrypoint, volume, port, stop signal; moatd serves an environment from it)"
