#!/usr/bin/env bash
# Starts or stops a real Redis Cluster on loopback for tests and benchmarks:
# 3 masters, plus 3 replicas with --replicas.
#   scripts/cluster.sh start [--replicas] [--port BASE] [--dir DIR]
#   scripts/cluster.sh stop  [--dir DIR]
# Nodes listen on BASE..BASE+5 (default 7100) on 127.0.0.1, keep their files
# in DIR (default ./data/cluster) and are stopped by the pids recorded there.
# `start` prints the seed list for `redis.cluster_nodes`.
set -euo pipefail
cmd="${1:-}"; shift || true
base=7100; dir="$PWD/data/cluster"; replicas=0
while [ $# -gt 0 ]; do
  case "$1" in
    --replicas) replicas=1 ;;
    --port) base="$2"; shift ;;
    --dir) dir="$2"; shift ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
  shift
done

case "$cmd" in
  start)
    command -v redis-server >/dev/null || { echo "redis-server is missing: run scripts/test.sh once" >&2; exit 1; }
    n=$(( replicas ? 6 : 3 ))
    mkdir -p "$dir"
    nodes=()
    for i in $(seq 0 $((n - 1))); do
      port=$((base + i)); d="$dir/$port"; mkdir -p "$d"
      redis-server --port "$port" --bind 127.0.0.1 --dir "$d" --cluster-enabled yes \
        --cluster-config-file nodes.conf --cluster-node-timeout 2000 --save '' --appendonly no \
        --hash-max-listpack-value 1024 --maxmemory-policy noeviction \
        --daemonize yes --pidfile "$d/redis.pid" --logfile "$d/redis.log"
      nodes+=("127.0.0.1:$port")
    done
    for node in "${nodes[@]}"; do
      for _ in $(seq 100); do redis-cli -u "redis://$node" PING >/dev/null 2>&1 && break; sleep 0.05; done
    done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas "$replicas" --cluster-yes >"$dir/create.log"
    for _ in $(seq 200); do
      redis-cli -p "$base" CLUSTER INFO | grep -q 'cluster_state:ok' && break; sleep 0.05
    done
    seeds=$(printf 'redis://%s,' "${nodes[@]:0:3}")
    echo "${seeds%,}"
    ;;
  stop)
    for pidfile in "$dir"/*/redis.pid; do
      [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
    ;;
  *) echo "usage: scripts/cluster.sh start [--replicas] [--port BASE] [--dir DIR] | stop [--dir DIR]" >&2; exit 2 ;;
esac
