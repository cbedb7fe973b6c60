#!/usr/bin/env bash
# Deletes each safety guard of the Lua scripts once and runs the integration
# tests against the broken script: every guard must be held by a test that
# fails without it. Prints one line per guard, "held" (some test failed) or
# "NOT HELD" (every test passed), and exits 1 if any guard is not held.
# The scripts are restored after each run (and on exit). Takes ~20 minutes.
#
#   scripts/lua-guards.sh [FILTER...]   FILTER: test-name filters for the it binary
set -euo pipefail
cd "$(dirname "$0")/.."

# name | file | exact text | replacement
GUARDS=(
  "complete: attempt token|lua/complete_jobs.lua|current[i] = f[1] == 'inflight' and f[2] == ARGV[i + 1]|current[i] = f[1] == 'inflight'"
  "complete: state inflight|lua/complete_jobs.lua|current[i] = f[1] == 'inflight' and f[2] == ARGV[i + 1]|current[i] = f[2] == ARGV[i + 1]"
  "fail: attempt token|lua/fail_job.lua|if f[1] ~= 'inflight' or f[2] ~= ARGV[2] then return {0} end|if f[1] ~= 'inflight' then return {0} end"
  "fail: state inflight|lua/fail_job.lua|if f[1] ~= 'inflight' or f[2] ~= ARGV[2] then return {0} end|if f[2] ~= ARGV[2] then return {0} end"
  "defer: attempt token|lua/defer_jobs.lua|  if f[1] == 'inflight' and f[2] == token then|  if f[1] == 'inflight' then"
  "defer: state inflight|lua/defer_jobs.lua|  if f[1] == 'inflight' and f[2] == token then|  if f[2] == token then"
  "park: attempt token|lua/park_jobs.lua|  if f[1] == 'inflight' and f[2] == token then|  if f[1] == 'inflight' then"
  "park: attempt not counted|lua/park_jobs.lua|'att', tonumber(token) - 1,|'att', tonumber(token),"
  "unpark: cancelled or changed jobs stay out|lua/unpark_jobs.lua|  if f[1] == 'scheduled' and not f[2] and f[3] == ARGV[2] then|  if f[1] then"
  "probe: one probe at a time|lua/host_probe.lua|if state == 'half_open' and now >= (tonumber(f[3]) or 0) then|if state == 'half_open' then"
  "breaker: opens only at the threshold|lua/host_failure.lua|if state == 'closed' and threshold > 0 and fails >= threshold then|if state == 'closed' and threshold > 0 then"
  "claim: only ready jobs (tombstones skipped)|lua/claim_ready.lua|  elseif f[1] == 'ready' then|  elseif f[1] then"
  "reclaim: only inflight jobs|lua/reclaim_expired.lua|  if f[1] == 'inflight' then|  if f[1] then"
  "reclaim: last attempt dead-letters|lua/reclaim_expired.lua|    if tonumber(f[2]) >= tonumber(f[3]) then|    if tonumber(f[2]) > tonumber(f[3]) then"
  "cancel: finished jobs stay finished|lua/cancel_job.lua|if state == 'delivered' or state == 'dead' then return -2 end|"
  "cancel: in-flight lease dropped|lua/cancel_job.lua|  rcall('ZREM', KEYS[3], ARGV[1])|  rcall('EXISTS', KEYS[3])"
  "replay: a live job is not replayed|lua/replay_dead.lua|if state == 'scheduled' or state == 'ready' or state == 'inflight' then|if false then"
  "reschedule: only scheduled jobs|lua/reschedule_job.lua|if f[1] ~= 'scheduled' then return {-2, f[1]} end|"
  "reschedule: spec unchanged since read|lua/reschedule_job.lua|if f[4] ~= ARGV[9] then return {-3, f[1]} end|"
  "enqueue: an existing id is not overwritten|lua/enqueue_jobs.lua|    if f[1] then|    if false then"
)

backup="$(mktemp -d)"
cp lua/*.lua "$backup/"
restore() { cp "$backup"/*.lua lua/; }
trap restore EXIT

filters=("$@")
[ "${#filters[@]}" -eq 0 ] && filters=(--skip cluster:: --skip abuse:: --skip crash::kill_9 --skip crash::redis_sigkill)

echo "== building the tests against the intact scripts"
cargo test --quiet --test it --no-run 2>/dev/null
failed=0
for guard in "${GUARDS[@]}"; do
  IFS='|' read -r name file text replacement <<<"$guard"
  restore
  python3 - "$file" "$text" "$replacement" <<'PY'
import sys
path, text, replacement = sys.argv[1:]
source = open(path).read()
if source.count(text) != 1:
    sys.exit(f"{path}: the guard text occurs {source.count(text)} times: {text!r}")
open(path, "w").write(source.replace(text, replacement))
PY
  log="$backup/$(echo "$name" | tr -c 'a-z0-9' '_').log"
  if cargo test --quiet --test it -- "${filters[@]}" >"$log" 2>&1; then
    echo "NOT HELD  $name ($file)"
    failed=1
  else
    first="$(grep -m1 -E "^    [a-z_]+::[a-z0-9_]+$" "$log" | tr -d ' ' || true)"
    echo "held      $name ($file): ${first:-see $log}"
  fi
done
restore
exit "$failed"
