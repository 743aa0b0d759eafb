# Sourced by the bench scripts that start their own moatd.

# Waits up to 10 s for moatd on state directory $1 to listen and write its
# master token, or until its process ($3) has exited. If it did not start,
# says so with the end of its log ($2) and fails (the scripts run with set -e).
wait_for_moatd() {
  for _ in $(seq 200); do
    [ -S "$1/moatd.sock" ] && [ -s "$1/master-token" ] && return 0
    [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null && break
    sleep 0.05
  done
  echo "moatd on $1 did not start${2:+; the end of its log $2:}" >&2
  [ -n "${2:-}" ] && tail -n 20 "$2" >&2
  return 1
}
