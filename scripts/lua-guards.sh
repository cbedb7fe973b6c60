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
  "complete: attempt token|lua/complete_jobs.lua|  if r ~= nil and r.state == 'i' and r.att == tonumber(ARGV[i + 1]) then|  if r ~= nil and r.state == 'i' then"
  "complete: state inflight|lua/complete_jobs.lua|  if r ~= nil and r.state == 'i' and r.att == tonumber(ARGV[i + 1]) then|  if r ~= nil and r.att == tonumber(ARGV[i + 1]) then"
  "fail: attempt token|lua/fail_job.lua|if not r or r.state ~= 'i' or r.att ~= tonumber(ARGV[2]) then return {UNCHANGED} end|if not r or r.state ~= 'i' then return {UNCHANGED} end"
  "fail: state inflight|lua/fail_job.lua|if not r or r.state ~= 'i' or r.att ~= tonumber(ARGV[2]) then return {UNCHANGED} end|if not r or r.att ~= tonumber(ARGV[2]) then return {UNCHANGED} end"
  "defer: attempt token|lua/defer_jobs.lua|  if r and r.state == 'i' and r.att == token then|  if r and r.state == 'i' then"
  "defer: state inflight|lua/defer_jobs.lua|  if r and r.state == 'i' and r.att == token then|  if r and r.att == token then"
  "park: attempt token|lua/park_jobs.lua|  if r and r.state == 'i' and r.att == token then|  if r and r.state == 'i' then"
  "park: attempt not counted|lua/park_jobs.lua|r.state, r.att, r.seq, r.ut = 'p', token - 1, seq, now|r.state, r.att, r.seq, r.ut = 'p', token, seq, now"
  "unpark: cancelled or changed jobs stay out|lua/unpark_jobs.lua|  if r and r.state == 'p' and r.seq == tonumber(string.sub(head[i], 1, 12), 16) then|  if r then"
  "probe: one probe at a time|lua/host_probe.lua|if state == 'half_open' and now >= (tonumber(f[3]) or 0) then|if state == 'half_open' then"
  "breaker: opens only at the threshold|lua/host_failure.lua|if state == 'closed' and threshold > 0 and fails >= threshold then|if state == 'closed' and threshold > 0 then"
  "claim: only ready jobs (tombstones skipped)|lua/claim_ready.lua|  elseif r and rec_ready(r, now) and not taken[id] then|  elseif r and not taken[id] then"
  "reclaim: only inflight jobs|lua/reclaim_expired.lua|  if r and r.state == 'i' then|  if r then"
  "reclaim: last attempt dead-letters|lua/reclaim_expired.lua|    if r.att >= r.max then|    if r.att > r.max then"
  "cancel: finished jobs stay finished|lua/cancel_job.lua|if state == 'd' or state == 'x' then return WRONG_STATE end|"
  "cancel: in-flight lease dropped|lua/cancel_job.lua|  rcall('ZREM', KEYS[3], ARGV[1])|  rcall('EXISTS', KEYS[3])"
  "replay: a live job is not replayed|lua/replay_dead.lua|if r and (r.state == 's' or r.state == 'w' or r.state == 'p' or r.state == 'r' or r.state == 'i' or r.state == 'o') then|if false then"
  "reschedule: only scheduled jobs|lua/reschedule_job.lua|if (r.state ~= 's' and r.state ~= 'w' and r.state ~= 'p' and r.state ~= 'o') or rec_ready(r, now) then|if false then"
  "reschedule: spec unchanged since read|lua/reschedule_job.lua|if r.spec ~= ARGV[9] then return {CHANGED, 'scheduled'} end|"
  "enqueue: an existing id is not overwritten|lua/enqueue_jobs.lua|    if r then|    if false then"
  "enqueue: a re-create with another due time conflicts|lua/enqueue_jobs.lua|r.spec == spec and r.given == tonumber(ARGV[i + 6])|r.spec == spec"
  "enqueue: a finished job's summary counts as existing|lua/enqueue_jobs.lua|      if s then|      if false then"
  "cancel: a finished job's summary stays finished|lua/cancel_job.lua|    if summary then return WRONG_STATE end|"
  "wheel: tombstones skipped when a bucket opens|lua/prelude.lua|      if r and r.state == 'w' then|      if r then"
  "enqueue: a job behind its key's earlier jobs is held|lua/enqueue_jobs.lua|    if ahead ~= '' then|    if false then"
  "order: only the head's finish releases the next|lua/prelude.lua|  if plan.head ~= id then|  if false then"
  "reschedule: a held job stays held|lua/reschedule_job.lua|if r.state == 'o' then|if false then"
  "place: a job that exists keeps its place|lua/place_jobs.lua|  elseif plan.exists then|  elseif false then"
  "unplace: a live job's pointer stays|lua/unplace_jobs.lua|    if ARGV[i + 2] == '1' then|    if false then"
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
