#!/usr/bin/env bash
# hookq's benchmark: starts its own redis-server and a Rust HTTP sink on
# loopback, runs every SPEC §10 scenario (medians of 3 runs by default) and
# prints one JSON line per scenario plus a markdown table.
#   scripts/bench.sh                 # full run (several minutes on 2 cores)
#   scripts/bench.sh --quick         # smoke test, tiny sizes, no assertions
#   scripts/bench.sh --only delivery # scenarios whose name starts with this
#   scripts/bench.sh --only 'delivery_rate$' # exactly that scenario
#   scripts/bench.sh --runs 5
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v redis-server >/dev/null; then
  echo "redis-server is missing: run scripts/test.sh once (it installs it), or apt-get install redis-server" >&2
  exit 1
fi
exec cargo bench --quiet --bench bench -- "$@"
