#!/usr/bin/env bash
# Where a benchmark scenario's Redis CPU goes, read live (docs/performance.md,
# "profile first"). The distro's redis-server is stripped, so a profile of it
# names Lua's and Redis's internals by the nearest exported symbol; this
# builds the same version from the distro's source with its symbols and
# runs the benchmark against it.
#   scripts/profile-redis.sh build
#       builds target/redis-symbols/redis-server (apt-get source of the
#       installed redis-server's package, Lua and Redis with symbols, the
#       system jemalloc as the distro's build uses); once, then kept
#   scripts/profile-redis.sh perf SCENARIO [AT] [SECONDS]
#       runs the scenario once (`--only 'SCENARIO$' --runs 1`) on that
#       redis-server and records it with `perf record --call-graph dwarf`
#       from AT s (5) after the start for SECONDS s (8), then prints the
#       samples split by what Redis was doing: each command run by a script,
#       the Lua work around redis.call, garbage collection, the arguments'
#       tables, the event loop (scripts/profile-split.py perf)
#   scripts/profile-redis.sh slowlog SCENARIO [AT] [SECONDS]
#       the same window read from SLOWLOG (every command logged, 0 µs
#       threshold): the time of each library function and of each command
#       the functions ran, with calls and arguments (profile-split.py
#       slowlog). The log's own cost inflates the functions' times a little.
# For steady_2000 the due window runs from ~4 s to ~14 s after the start.
# Output goes to target/profile/<SCENARIO>.{perf.data,txt,slowlog.json}.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

symbols=target/redis-symbols

build() {
  if [ -x "$symbols/redis-server" ]; then
    echo "$symbols/redis-server (built before; delete it to rebuild)"
    return
  fi
  local pkg version
  command -v redis-server >/dev/null ||
    { echo "redis-server is not installed: scripts/test.sh installs it (its version is the one built)" >&2; exit 1; }
  pkg=$(dpkg-query -S "$(command -v redis-server)" 2>/dev/null | cut -d: -f1 || true)
  [ -n "$pkg" ] || pkg=redis-server
  version=$(dpkg-query -W -f '${source:Version}' "$pkg")
  command -v make >/dev/null && command -v cc >/dev/null || apt_install build-essential
  dpkg-query -W libjemalloc-dev >/dev/null 2>&1 || apt_install libjemalloc-dev
  command -v dpkg-source >/dev/null || apt_install dpkg-dev
  mkdir -p "$symbols/src" "$symbols/lists/partial"
  # The source index from the same mirrors as the binaries, in a private
  # list so that the system's apt configuration is left as it is.
  local list="$symbols/sources.list"
  {
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | sed 's/^deb /deb-src /' || true
    # deb822 files: a line per stanza's URI and suite, signed by its key.
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -e "$f" ] || continue
      awk 'function stanza(i) {
             if (uri != "") for (i = 2; i <= n; i++) print "deb-src " key uri " " suites[i] " main"
             uri = ""; key = ""; n = 0
           }
           /^URIs:/ {uri = $2}
           /^Signed-By:/ {key = "[signed-by=" $2 "] "}
           /^Suites:/ {for (i = 2; i <= NF; i++) suites[i] = $i; n = NF}
           /^$/ {stanza()}
           END {stanza()}' "$f"
    done
  } | sort -u >"$list"
  local apt=(apt-get -o "Dir::Etc::SourceList=$PWD/$list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$PWD/$symbols/lists")
  as_root "${apt[@]}" update -qq
  (cd "$symbols/src" && "${apt[@]}" source -qq "redis=$version")
  local dir
  dir=$(find "$symbols/src" -maxdepth 1 -type d -name 'redis-*' | head -1)
  make -C "$dir" -j"$(nproc)" USE_SYSTEM_JEMALLOC=yes USE_SYSTEMD=no BUILD_TLS=no >"$symbols/build.log" 2>&1 ||
    { tail -20 "$symbols/build.log"; exit 1; }
  cp "$dir/src/redis-server" "$dir/src/redis-cli" "$symbols/"
  echo "$symbols/redis-server: $("$symbols/redis-server" --version)"
}

# The bench binary (release), built if need be.
bench_binary() {
  cargo bench --bench bench --no-run --message-format=json 2>/dev/null | cargo_executable bench
}

# Runs SCENARIO in the background on the symbolized Redis; sets `pid` to
# that Redis's process id and `run` to the bench's.
start_scenario() {
  local bench
  bench=$(bench_binary)
  [ -n "$bench" ] || { echo "could not build the benchmark" >&2; exit 1; }
  mkdir -p target/profile
  PATH="$PWD/$symbols:$PATH" "$bench" --bench --only "$1\$" --runs 1 >"target/profile/$1.bench.out" 2>&1 &
  run=$!
  pid=""
  for _ in $(seq 200); do
    pid=$(pgrep -P "$run" -x redis-server | head -1 || true)
    [ -n "$pid" ] && break
    sleep 0.05
  done
  [ -n "$pid" ] || { echo "the benchmark's redis-server did not start" >&2; kill "$run"; exit 1; }
}

case "${1:-}" in
  build) build ;;
  perf | slowlog)
    what=$1 scenario=${2:?usage: scripts/profile-redis.sh $1 SCENARIO [AT] [SECONDS]}
    at=${3:-5} seconds=${4:-8}
    build >/dev/null
    command -v perf >/dev/null || apt_install linux-perf
    start_scenario "$scenario"
    sleep "$at"
    out="target/profile/$scenario"
    if [ "$what" = perf ]; then
      as_root perf record -q -F 9999 --call-graph dwarf,16384 -p "$pid" -o "$out.perf.data" -- sleep "$seconds"
      wait "$run"
      as_root perf script -i "$out.perf.data" 2>/dev/null >"$out.perf.txt"
      python3 scripts/profile-split.py perf "$out.perf.txt"
    else
      port=$(ps -o args= -p "$pid" | sed 's/.*://')
      cli=("$symbols/redis-cli" -p "$port")
      "${cli[@]}" config set slowlog-max-len 1000000 >/dev/null
      "${cli[@]}" slowlog reset >/dev/null
      "${cli[@]}" config set slowlog-log-slower-than 0 >/dev/null
      sleep "$seconds"
      "${cli[@]}" config set slowlog-log-slower-than 10000 >/dev/null
      "${cli[@]}" --json slowlog get 1000000 >"$out.slowlog.json"
      wait "$run"
      python3 scripts/profile-split.py slowlog "$out.slowlog.json"
    fi
    grep '^{' "target/profile/$scenario.bench.out" || true
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
    ;;
esac
