#!/usr/bin/env bash
# hookq's benchmark: starts its own redis-server (stock settings), nginx
# (`return 204`, the reference receiver) and a Rust HTTP sink on loopback,
# runs every SPEC §10/§11.6 scenario (medians of 3 runs by default) and
# prints one JSON line per scenario plus a markdown table.
#   scripts/bench.sh                 # full run (long: memory_steady_load, last,
#                                    # alone takes 10 minutes)
#   scripts/bench.sh --quick         # smoke test, tiny sizes, no assertions
#   scripts/bench.sh --only delivery # scenarios whose name starts with this
#   scripts/bench.sh --only 'delivery_rate$' # exactly that scenario
#   scripts/bench.sh --only one_host,many_hosts # several prefixes
#   scripts/bench.sh --runs 5
#   scripts/bench.sh --only memory_steady_load  # Redis memory under 2,000 jobs/s
#                                    # for 10 minutes (runs once, whatever --runs)
#   scripts/bench.sh --only memory_steady_load --steady-secs 60 --steady-retention 20
#                                    # shorter (also --steady-rate N, --steady-sample N)
#   scripts/bench.sh --peers         # also BullMQ on the same Redis and nginx
#   scripts/bench.sh --peers --only peer --peer-concurrency 512
#   scripts/bench.sh --help          # the flags; an unknown one is refused
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v wrk >/dev/null || missing+=(wrk)
# Debian puts nginx in /usr/sbin, which is not on a non-root user's PATH.
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
for arg in "$@"; do
  if [ "$arg" = "--peers" ]; then
    # The peers are a Node project (benches/peers/); the bench installs its
    # pinned packages with npm on first use.
    command -v node >/dev/null || missing+=(nodejs)
    command -v npm >/dev/null || missing+=(npm)
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "missing: ${missing[*]}: run scripts/test.sh once (it installs all but nodejs/npm), or apt-get install ${missing[*]}" >&2
  exit 1
fi
exec cargo bench --quiet --bench bench -- "$@"
