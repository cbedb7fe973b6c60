#!/usr/bin/env bash
# Starts hookq against a local Redis, on a fresh Debian/Ubuntu machine that
# has only a Rust toolchain:
#   1. installs redis-server (and redis-cli, curl) if missing;
#   2. if nothing answers PING at REDIS_URL (default redis://127.0.0.1:6379/0)
#      and it names this machine, starts a redis-server there with AOF
#      persistence, data and log in ./data/redis;
#   3. builds hookq (release; a few minutes the first time);
#   4. runs `hookq serve` and prints its address once /readyz answers.
#
#   scripts/run.sh [SERVE ARGS]               in the foreground; Ctrl-C stops hookq
#   scripts/run.sh --background [SERVE ARGS]  returns once hookq is ready
#                                             (log: data/hookq.log)
#   scripts/run.sh stop                       stops the background hookq and the
#                                             Redis this script started
#
# SERVE ARGS pass through to `hookq serve`, e.g. --config config.example.toml.
# Without --config, hookq uses its defaults plus HOOKQ_<SECTION>__<KEY>
# variables. REDIS_URL (or HOOKQ_REDIS__URL) picks the Redis; it is exported
# as HOOKQ_REDIS__URL, so it wins over a config file's redis.url. HOOKQ_BIN
# runs that hookq binary instead of building one (the tests use it).
set -euo pipefail
cd "$(dirname "$0")/.."
# A value without the quotes of a TOML string: hookq's environment values
# parse as TOML, so `HOOKQ_API__LISTEN='"127.0.0.1:8080"'` is as good as the
# bare string, and this script reads both alike.
unquote() {
  local value="$1" double='^"(.*)"$' single="^'(.*)'\$"
  if [[ "$value" =~ $double || "$value" =~ $single ]]; then
    value="${BASH_REMATCH[1]}"
  fi
  printf '%s' "$value"
}

REDIS_URL="$(unquote "${REDIS_URL:-${HOOKQ_REDIS__URL:-redis://127.0.0.1:6379/0}}")"
export HOOKQ_REDIS__URL="$REDIS_URL"
DATA="$PWD/data"
HOOKQ_PID="$DATA/hookq.pid"
REDIS_PID="$DATA/redis/redis.pid"

# as_root, apt_install
source scripts/lib.sh

# True if the Redis at REDIS_URL answers PONG.
redis_answers() {
  [ "$(redis-cli -u "$REDIS_URL" ping 2>/dev/null)" = "PONG" ]
}

# Half the machine's RAM in bytes, the maxmemory of the Redis this script
# starts: with `noeviction`, Redis then answers writes with an error (hookq's
# API a 503) instead of growing until the machine swaps or the OOM killer
# picks it; `hookq doctor` projects memory against it.
redis_maxmemory() {
  awk '/^MemTotal:/ { printf "%d", $2 * 1024 / 2 }' /proc/meminfo
}

# True while the process in pid file $1 runs.
running() {
  [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

# Sends SIGTERM to the process in pid file $1 and waits up to $2 seconds.
stop_pidfile() {
  local pidfile="$1" seconds="$2" what="$3"
  if ! running "$pidfile"; then
    echo "== $what is not running"
    rm -f "$pidfile"
    return
  fi
  local pid
  pid="$(cat "$pidfile")"
  echo "== stopping $what (pid $pid)"
  kill -TERM "$pid"
  for _ in $(seq $((seconds * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "$what (pid $pid) did not stop within ${seconds}s" >&2
    exit 1
  fi
  rm -f "$pidfile"
}

if [ "${1:-}" = "stop" ]; then
  # hookq first (it lets attempts in flight finish), then Redis.
  stop_pidfile "$HOOKQ_PID" 60 "hookq"
  stop_pidfile "$REDIS_PID" 30 "redis-server started by scripts/run.sh"
  exit 0
fi

background=0
if [ "${1:-}" = "--background" ]; then
  background=1
  shift
fi

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  apt_install redis-server
fi
if ! command -v curl >/dev/null 2>&1; then
  apt_install curl
fi

if redis_answers; then
  echo "== using the Redis at $REDIS_URL"
else
  # host[:port] out of redis://[user:pass@]host[:port][/db]
  hostport="${REDIS_URL#*://}"
  hostport="${hostport##*@}"
  hostport="${hostport%%/*}"
  port=6379
  host="$hostport"
  if [[ "$hostport" =~ ^(.*):([0-9]+)$ ]]; then
    host="${BASH_REMATCH[1]}"
    port="${BASH_REMATCH[2]}"
  fi
  case "$REDIS_URL:$host" in
    redis://*:127.0.0.1 | redis://*:localhost | redis://*:\[::1\]) ;;
    *)
      echo "nothing answers at $REDIS_URL, and it is not a local redis:// URL to start" >&2
      exit 1
      ;;
  esac
  mkdir -p "$DATA/redis"
  echo "== starting redis-server on 127.0.0.1:$port (AOF on, data in data/redis)"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$DATA/redis" \
    --appendonly yes --appendfsync everysec --maxmemory-policy noeviction \
    --maxmemory "$(redis_maxmemory)" \
    --hash-max-listpack-value 1024 \
    --daemonize yes --pidfile "$REDIS_PID" --logfile "$DATA/redis/redis.log"
  # Wait up to 10 s (an AOF is replayed before PING answers).
  for _ in $(seq 100); do
    redis_answers && break
    sleep 0.1
  done
  if ! redis_answers; then
    echo "redis-server did not answer at $REDIS_URL; see data/redis/redis.log" >&2
    exit 1
  fi
fi

if [ -n "${HOOKQ_BIN:-}" ]; then
  BIN="$HOOKQ_BIN"
else
  echo "== cargo build --release (a few minutes the first time)"
  cargo build --release --quiet
  BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/hookq"
fi

# The address hookq listens on: --listen, else HOOKQ_API__LISTEN, else the
# config file's api.listen, else the default.
listen="$(unquote "${HOOKQ_API__LISTEN:-}")"
args=("$@")
for i in "${!args[@]}"; do
  case "${args[$i]}" in
    --listen) listen="${args[$((i + 1))]:-}" ;;
    --listen=*) listen="${args[$i]#--listen=}" ;;
    --config) config_file="${args[$((i + 1))]:-}" ;;
    --config=*) config_file="${args[$i]#--config=}" ;;
  esac
done
if [ -z "$listen" ] && [ -n "${config_file:-}" ]; then
  listen="$(sed -n '/^\[api\]/,/^\[/s/^listen *= *"\(.*\)".*/\1/p' "$config_file" | head -1)"
fi
listen="${listen:-127.0.0.1:8080}"
url="http://${listen/0.0.0.0/127.0.0.1}"

# Waits until /readyz answers 200, or fails if hookq (pid $1) exits first.
wait_ready() {
  local pid="$1" log="$2"
  for _ in $(seq 300); do
    if curl -fs -o /dev/null "$url/readyz"; then
      echo "== hookq is ready at $url"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "hookq exited before it was ready${log:+; last lines of $log:}" >&2
      [ -n "$log" ] && tail -20 "$log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "hookq did not answer $url/readyz within 30 s" >&2
  return 1
}

if [ "$background" -eq 1 ]; then
  if running "$HOOKQ_PID"; then
    echo "hookq already runs (pid $(cat "$HOOKQ_PID")); scripts/run.sh stop stops it" >&2
    exit 1
  fi
  mkdir -p "$DATA"
  nohup "$BIN" serve "$@" >>"$DATA/hookq.log" 2>&1 &
  echo $! >"$HOOKQ_PID"
  wait_ready "$!" "$DATA/hookq.log"
  echo "== log: data/hookq.log; stop hookq and the Redis it started: scripts/run.sh stop"
  exit 0
fi

echo "== hookq serve${*:+ $*} (Ctrl-C stops it)"
# hookq runs in a session of its own, so a Ctrl-C reaches only this script,
# whose trap sends hookq one SIGTERM: a graceful drain. (In the terminal's
# process group it would get the SIGINT too, and a second signal makes hookq
# exit at once, leaving its attempts to their leases.)
setsid "$BIN" serve "$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true' INT TERM HUP
if wait_ready "$pid" ""; then
  if running "$REDIS_PID"; then
    echo "== the Redis this script started keeps running; scripts/run.sh stop stops it"
  fi
fi
status=0
wait "$pid" || status=$?
if [ "$status" -gt 128 ]; then
  # Interrupted by the trapped signal (or hookq died of one): wait for
  # hookq's own exit status; 127 means it was already reported.
  real=0
  wait "$pid" 2>/dev/null || real=$?
  [ "$real" -ne 127 ] && status=$real
fi
exit "$status"
