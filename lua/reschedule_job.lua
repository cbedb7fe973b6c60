--[[
  Replace a scheduled job's content and/or due time. Only a job that is still
  `scheduled` changes; once the carrier has promoted it (or it is in flight or
  finished) the answer is a conflict and nothing changes. A job held behind
  earlier jobs of its ordering key (see the prelude) changes whatever its
  due time, and stays held.

  Input:
    KEYS[1] record hash      <ns>:{p}:jobs:<shard>  (the job's live record)
    KEYS[2] due zset        <ns>:{p}:due  (the default tenant's; see the
            prelude for the other tenants' and their index)
    KEYS[3] ready list      <ns>:{p}:ready
            (its in-flight set `<ns>:{p}:inflight` is built from it; a
            job of a live round lease is found in the round space and its
            round materialized: see "Round leases" in the prelude)
    KEYS[4] sequence        <ns>:{p}:seq
    ARGV[1] id
    ARGV[2] new job spec JSON
    ARGV[3] absolute due time in epoch ms, "" for relative, or "keep"
    ARGV[4] delay in ms (used when ARGV[3] is "")
    ARGV[5] max attempts (rungs + 1)
    ARGV[6] lease in ms for this job, or "" for the daemon default
    ARGV[7] wake channel
    ARGV[8] partition number
    ARGV[9] the spec JSON the change was computed from (optimistic check)
    ARGV[10] the given due time the header keeps (see the prelude)
  Output:
    {DONE, state, due, now}  changed
    {NOT_FOUND}              no such job
    {WRONG_STATE, state}     not scheduled (nothing changed)
    {CHANGED, state}         changed by someone else since it was read (nothing changed)
    (the codes of the prelude)
]]
local rcall = redis.call
local at = {h = KEYS[1], id = ARGV[1]}
local r = rec_get(at)
if not r then return {NOT_FOUND} end
local now = now_ms()
-- (A scheduled record whose time has come is ready: promoted, or about to be.)
-- (A job claimed ahead of its due time is in flight: its lease says so.)
local inflight = partition_prefix(KEYS[3], 'ready') .. 'inflight'
if (r.state ~= 's' and r.state ~= 'w' and r.state ~= 'p' and r.state ~= 'o') or rec_ready(r, now)
    or rec_in_flight(r, inflight, ARGV[1]) then
  return {WRONG_STATE, live_state_name(r, now, inflight, ARGV[1])}
end
if r.spec ~= ARGV[9] then return {CHANGED, 'scheduled'} end

local due
if ARGV[3] == 'keep' then
  due = r.due
elseif ARGV[3] ~= '' then
  due = tonumber(ARGV[3])
else
  due = now + tonumber(ARGV[4])
end
local prefix = partition_prefix(KEYS[3], 'ready')
-- A job due far ahead goes to a wheel bucket, a key this script builds: not
-- while the partition's slot is moving (see the prelude).
if IN_CLUSTER and due > now and wheel_slot(due, now) and slot_moving(KEYS[2]) then
  return try_again()
end

if due <= now and r.state ~= 'o' and ready_push_blocked(KEYS[3], {ARGV[1]}) then
  return try_again()
end
-- Its tenant's due set (and their index), which it may leave or join.
if due_blocked(KEYS[2], {ARGV[1]}) then return try_again() end

-- The job leaves where it waits: its due set (its member), the wheel (its
-- id stays in its bucket as a tombstone), or its host's parking (its entry
-- no longer matches its sequence and is skipped when the host drains).
if r.state == 's' and r.seq > 0 then due_remove(KEYS[2], ARGV[1], r.seq, prefix) end
local wheel_delta = 0
if r.state == 'w' then wheel_delta = -1 end
r.max, r.due, r.ut, r.lease = tonumber(ARGV[5]), due, now, tonumber(ARGV[6]) or 0
r.given = tonumber(ARGV[10])

local state
if r.state == 'o' then
  -- Held: it stays in its place in the line, in none of the sets.
  r.spec = ARGV[2]
  rec_put(at, r)
  return {DONE, state_name(r, now), due, now}
elseif due <= now then
  state = 'ready'
  r.state, r.seq, r.spec = 'r', 0, ARGV[2]
  rec_put(at, r)
  if ready_push(KEYS[3], {ARGV[1]}) then wake_ready(ARGV[7], ARGV[8]) end
else
  state = 'scheduled'
  local before = next_wake(KEYS[2])
  r.seq, r.spec = rcall('INCR', KEYS[4]), ARGV[2]
  local wake = schedule(prefix, KEYS[2], ARGV[1], r, now)
  if r.state == 'w' then wheel_delta = wheel_delta + 1 end
  if wake and (not before or wake < before) then wake_due(ARGV[7], ARGV[8], wake) end
end
wheel_count(prefix, wheel_delta)
return {DONE, state, due, now}
