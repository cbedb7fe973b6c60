--[[
  Record a failed attempt: either schedule the next rung (back to its due set,
  or to the timing wheel when far ahead)
  or dead-letter the job (out of the live sets and onto the dead-letter stream,
  in this same atomic step; a job with an ordering key then leaves its
  ordering list, releasing the job behind it, see the prelude).

  Input:
    KEYS[1] record hash     <ns>:{p}:jobs:<shard>  (the job's live record;
            a dead job's record moves to <ns>:{p}:job:<id>)
    KEYS[2] inflight zset   <ns>:{p}:inflight
            (a job of a live round lease is found in the round space and
            its round materialized first: see "Round leases" in the prelude)
    KEYS[3] history list    <ns>:{p}:hist:<id>
    KEYS[4] due zset        <ns>:{p}:due  (the default tenant's; see the
            prelude for the other tenants' and their index)
    KEYS[5] sequence        <ns>:{p}:seq
    KEYS[6] dead stream     <ns>:{p}:dead
    KEYS[7] stats hash      <ns>:{p}:stats
    KEYS[8] dead-letter index <ns>:{p}:dead:ids
    ARGV[1] id
    ARGV[2] fencing token (the attempt number the lease was granted for)
    ARGV[3] attempt record JSON
    ARGV[4] retry delay in ms, or -1 to dead-letter
    ARGV[5] retention in ms (for a dead job's record)
    ARGV[6] last error (kind: message)
    ARGV[7] last HTTP status, or ""
    ARGV[8] topic
    ARGV[9] dead-letter stream cap
    ARGV[10] wake channel
    ARGV[11] partition number
  Keys built here (same hash tag): wheel buckets (see the prelude), a dead
  job's kept record, ordering lists, and the ledger `<ns>:{p}:ledger`
  (counting a dead-lettered job under its tenant).
  Output:
    {DONE, next_due}           retry scheduled at next_due (epoch ms)
    {DEAD_LETTERED, entry_id}  dead-lettered as stream entry entry_id
    {UNCHANGED}                stale: the lease was taken over or the job
                               was cancelled
    (the codes of the prelude)
]]
local rcall = redis.call
local r = rec_get({h = KEYS[1], id = ARGV[1]})
if not r or not rec_in_flight(r, KEYS[2], ARGV[1]) or rec_flight_attempt(r) ~= tonumber(ARGV[2]) then
  return {UNCHANGED}
end
-- The attempt made counts (a claim left the counter as it was).
r.att = tonumber(ARGV[2])

local now = now_ms()
local delay = tonumber(ARGV[4])
local prefix = partition_prefix(KEYS[2], 'inflight')
-- A retry far ahead goes to a wheel bucket, a key this script builds: not
-- while the partition's slot is moving (see the prelude).
if delay >= 0 and IN_CLUSTER and wheel_slot(now + delay, now) and slot_moving(KEYS[4]) then
  return try_again()
end
-- A retry joins its tenant's due set (and their index): likewise.
if delay >= 0 and due_blocked(KEYS[4], {ARGV[1]}) then return try_again() end
-- A dead job with an ordering key leaves its ordering list (read from its
-- spec: dead letters are rare).
if delay < 0 and not ledger_here(prefix) then return try_again() end
local order = delay < 0 and spec_order(r.spec, ARGV[1])
local line = nil
if order then
  line = order_plan(prefix, order)
  if not line then return try_again() end
end
rcall('ZREM', KEYS[2], ARGV[1])
history_push(KEYS[3], ARGV[3])
rcall('HINCRBY', KEYS[7], 'failed_attempts', 1)

if delay >= 0 then
  local before = next_wake(KEYS[4])
  r.due, r.seq, r.ut = now + delay, rcall('INCR', KEYS[5]), now
  local wake = schedule(prefix, KEYS[4], ARGV[1], r, now)
  if r.state == 'w' then wheel_count(prefix, 1) end
  if wake and (not before or wake < before) then wake_due(ARGV[10], ARGV[11], wake) end
  return {DONE, r.due}
end

local entry = dead_letter(KEYS[6], KEYS[8], ARGV[9], ARGV[1], ARGV[8], r.att, ARGV[6], ARGV[7],
  r.spec, now, r.given)
rec_set_dead(r, entry, now)
rec_keep(prefix, ARGV[1], r, ARGV[5])
rcall('PEXPIRE', KEYS[3], ARGV[5])
rcall('HINCRBY', KEYS[7], 'dead_lettered', 1)
ledger_one(prefix, 'dead_lettered', ARGV[1])
if line then order_leave(prefix, line, ARGV[1], now, ARGV[10], ARGV[11]) end
return {DEAD_LETTERED, entry}
