#!/usr/bin/env bash
# `make run`: the main job on its defaults. Today that is `moat run`: a fresh
# environment per command, every isolation layer on, destroyed afterwards.
set -euo pipefail
bin=${1:-build/bin}
moat="$bin/moat"
if [ "$(id -u)" -ne 0 ]; then
  echo "make run: moat creates namespaces, cgroups and mounts; run it as root (sudo make run)" >&2
  exit 1
fi
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

step "moat run -- python3 -c 'print(\"hello from\", socket.gethostname())'"
"$moat" run -- python3 -c 'import socket; print("hello from", socket.gethostname())'

step "moat run -- sh -c 'id; ls /; cat /proc/self/uid_map'   # root inside, not on the host"
"$moat" run -- sh -c 'id; ls /; cat /proc/self/uid_map'

step "echo 'print(1+1)' | moat run -i -- python3"
echo 'print(1+1)' | "$moat" run -i -- python3

step "moat run -- cat /proc/net/dev   # loopback only"
"$moat" run -- cat /proc/net/dev

step "moat run --memory 64 -- python3 -c 'bytearray(256 << 20)'   # the memory limit holds"
"$moat" run --memory 64 -- python3 -c 'bytearray(256 << 20)' || echo "exit code $?"

step "moat run --timeout 1 -- sleep 60"
"$moat" run --timeout 1 -- sleep 60 || echo "exit code $?"

step "moat run -- python3 -c '<call keyctl(2)>'   # seccomp denies kernel attack surface"
"$moat" run -- python3 -c 'import ctypes, os; r = ctypes.CDLL(None, use_errno=True).syscall(250, 0, 0); print("keyctl:", r, os.strerror(ctypes.get_errno()))'

printf '\nEach command above ran in its own environment, now destroyed.\n'

# The service: moatd on its defaults (state in /var/lib/moat, SQLite store,
# http://127.0.0.1:7070 and /var/lib/moat/moatd.sock), driven by the CLI.
state=${MOAT_STATE:-/var/lib/moat}
if ! "$moat" env ls >/dev/null 2>&1; then
  "$bin/moatd" --state "$state" &
  moatd_pid=$!
  for _ in $(seq 100); do "$moat" env ls >/dev/null 2>&1 && break; sleep 0.05; done
fi
step 'id=$(moat env create --task-id demo --memory 512)'
id=$("$moat" env create --task-id demo --memory 512)
echo "$id"
step "moat exec \$id -- python3 -c 'import platform; print(platform.node())'"
"$moat" exec "$id" -- python3 -c 'import platform; print(platform.node())'
step "moat exec \$id -- sh -c 'echo state persists > /workspace/f'; moat exec \$id -- cat /workspace/f"
"$moat" exec "$id" -- sh -c 'echo state persists > /workspace/f'
"$moat" exec "$id" -- cat /workspace/f
step "moat env ls"
"$moat" env ls
step 'moat env rm $id'
"$moat" env rm "$id"

if [ -n "${moatd_pid:-}" ]; then
  printf '\nmoatd is serving http://127.0.0.1:7070 and unix:%s/moatd.sock (token: %s/master-token).\n' "$state" "$state"
  printf 'The board: open http://127.0.0.1:7070/ and sign in with that token (docs/BOARD.md).\n'
  printf 'API: docs/API.md. Ctrl-C stops it and destroys its environments.\n'
  # Ctrl-C reaches moatd itself (it is in this terminal's process group):
  # the script only waits for it to finish stopping (a second signal would
  # hurry it). A TERM sent to the script alone is passed on.
  trap ':' INT
  trap 'kill -TERM $moatd_pid 2>/dev/null' TERM
  while kill -0 "$moatd_pid" 2>/dev/null; do wait "$moatd_pid" || true; done
fi
