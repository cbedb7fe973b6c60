#!/usr/bin/env bash
# Starts the hookq daemon against a local Redis:
#   1. installs redis-server (and redis-cli) if missing;
#   2. if nothing answers PING at REDIS_URL (default redis://127.0.0.1:6379/0)
#      and it names this machine, starts a redis-server there with AOF
#      persistence, data and log in ./data/redis;
#   3. runs `hookq serve` on that Redis; extra arguments pass through,
#      e.g. scripts/run.sh --config config.example.toml
# Without --config, hookq uses its defaults plus HOOKQ_<SECTION>__<KEY>
# variables. REDIS_URL (or HOOKQ_REDIS__URL) picks the Redis; it is exported
# as HOOKQ_REDIS__URL, so it wins over a config file's redis.url.
set -euo pipefail
cd "$(dirname "$0")/.."
REDIS_URL="${REDIS_URL:-${HOOKQ_REDIS__URL:-redis://127.0.0.1:6379/0}}"
export HOOKQ_REDIS__URL="$REDIS_URL"

# as_root, apt_install
source scripts/lib.sh

# True if the Redis at REDIS_URL answers PONG.
redis_answers() {
  [ "$(redis-cli -u "$REDIS_URL" ping 2>/dev/null)" = "PONG" ]
}

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  apt_install redis-server
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
  data="$PWD/data/redis"
  mkdir -p "$data"
  echo "== starting redis-server on 127.0.0.1:$port (AOF on, data in data/redis)"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$data" \
    --appendonly yes --appendfsync everysec --maxmemory-policy noeviction \
    --hash-max-listpack-value 1024 \
    --daemonize yes --pidfile "$data/redis.pid" --logfile "$data/redis.log"
  # Wait up to 10 s (an AOF is replayed before PING answers).
  for _ in $(seq 100); do
    redis_answers && break
    sleep 0.1
  done
  if ! redis_answers; then
    echo "redis-server did not answer at $REDIS_URL; see $data/redis.log" >&2
    exit 1
  fi
fi

echo "== cargo run --release -- serve${*:+ $*}"
exec cargo run --release --quiet -- serve "$@"
