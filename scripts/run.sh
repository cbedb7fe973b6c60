#!/usr/bin/env bash
# Starts hookq against a local Redis: installs redis-server if missing, starts
# one with AOF persistence in ./data/redis if nothing answers on REDIS_URL,
# then runs the daemon. Extra arguments go to `hookq serve`
# (e.g. --config config.example.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
export HOOKQ_REDIS__URL="${HOOKQ_REDIS__URL:-$REDIS_URL}"

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root (or sudo) to run: $*" >&2; exit 1; fi
}

if ! command -v redis-server >/dev/null; then
  echo "== installing redis-server"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi

if ! redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1; then
  port=$(python3 -c "from urllib.parse import urlparse; print(urlparse('$REDIS_URL').port or 6379)")
  mkdir -p data/redis
  echo "== starting redis-server on port $port (AOF on, data in data/redis)"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$PWD/data/redis" \
    --appendonly yes --appendfsync everysec --maxmemory-policy noeviction \
    --daemonize yes --pidfile "$PWD/data/redis/redis.pid" --logfile "$PWD/data/redis/redis.log"
  for _ in $(seq 100); do
    redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  redis-cli -u "$REDIS_URL" ping >/dev/null
fi

echo "== hookq serve (API on ${HOOKQ_API__LISTEN:-127.0.0.1:8080})"
exec cargo run --release --quiet -- serve "$@"
