# Sourced by the bench scripts that start their own moatd.

# Waits up to 10 s for moatd on state directory $1 to listen and write its
# master token.
wait_for_moatd() {
  for _ in $(seq 200); do [ -S "$1/moatd.sock" ] && [ -s "$1/master-token" ] && return 0; sleep 0.05; done
}
