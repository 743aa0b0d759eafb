#!/usr/bin/env bash
# Egress proxy benchmark: HTTPS latency (new connection and keep-alive) and
# download throughput, direct vs through moatd's proxy (CONNECT passthrough)
# vs intercepted (an environment with a secret), side by side in one run, in
# a private network namespace with the egress tests' test internet. Needs
# root. Usage: bench/egress.sh [BIN_DIR] [REQUESTS] [MIB]
# (bench/egress.py --help for the other knobs).
set -euo pipefail
exec python3 "$(dirname "$0")/egress.py" --bin-dir "${1:-build/bin}" --requests "${2:-300}" --mib "${3:-256}"
