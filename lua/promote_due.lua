--[[
  Move due jobs from the due set to the ready list, a bounded batch at a time,
  after opening the timing wheel's buckets whose time has come (see the
  prelude): at most a batch of their jobs move on, to finer buckets or into
  the due set.

  Input:
    KEYS[1] due zset        <ns>:{p}:due
    KEYS[2] ready list      <ns>:{p}:ready
    KEYS[3] wheel index     <ns>:{p}:wheel
    ARGV[1] batch size (at most this many jobs are moved)
    ARGV[2] job key prefix  <ns>:{p}:job:  (unused: records are found from KEYS[1]'s
            prefix, in the live record hashes)
  Output:
    {moved, next_due, now}: next_due is the earliest time work is left (the
    due set's head, or the next bucket to open; at most now when a bucket is
    still being opened), or -1 when there is none.
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local rcall = redis.call
local now = now_ms()
local prefix = partition_prefix(KEYS[1], 'due')
local batch = tonumber(ARGV[1])

-- Open the wheel's buckets whose time has come. Read pass first: the bucket
-- lists and records are keys this script builds, checked by Redis only when
-- touched (see the prelude).
-- The wheel's head is read once: when nothing opens (the usual case), it
-- also gives the next wake time below.
local wheel_head = tonumber(rcall('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')[2])
local buckets = {}
if wheel_head and wheel_head <= now then
  buckets = rcall('ZRANGE', KEYS[3], '-inf', now, 'BYSCORE', 'LIMIT', 0, 16)
end
if #buckets > 0 and IN_CLUSTER and slot_moving(KEYS[1]) then return try_again() end
local budget = batch
local opening = {}
for _, slot in ipairs(buckets) do
  if budget <= 0 then break end
  local bucket = prefix .. 'wheel:' .. slot
  local ids = rcall('LRANGE', bucket, 0, budget - 1)
  budget = budget - #ids
  opening[#opening + 1] = {slot, bucket, ids}
end
local to_due, moved_on, left_wheel = {}, wheel_batch(), 0
for _, o in ipairs(opening) do
  local slot, bucket, ids = o[1], o[2], o[3]
  for _, id in ipairs(ids) do
    local at = live(prefix, id)
    local r = rec_get(at)
    if r and r.state == 'w' then
      local next_slot, opens = wheel_slot(r.due, now)
      if next_slot then
        wheel_batch_add(moved_on, next_slot, opens, id)
      else
        rec_set_state(at, r, 's', now)
        to_due[#to_due + 1] = string.format('%d', r.due)
        to_due[#to_due + 1] = due_member(r.seq, id)
        left_wheel = left_wheel + 1
      end
    end
  end
  if #ids > 0 then rcall('LTRIM', bucket, #ids, -1) end
  if rcall('EXISTS', bucket) == 0 then rcall('ZREM', KEYS[3], slot) end
end
wheel_batch_push(prefix, moved_on)
wheel_count(prefix, -left_wheel)
if #to_due > 0 then rcall('ZADD', KEYS[1], unpack(to_due)) end

-- Due jobs move by id alone: their records are neither read nor written
-- (a scheduled record whose time has come reads as ready; claim_ready
-- checks each record, and drops an id whose job is gone).
local members = rcall('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, batch)
local ids = {}
for i, member in ipairs(members) do ids[i] = string.sub(member, 13) end
local moved = #ids
if moved > 0 then rcall('ZREM', KEYS[1], unpack(members)) end
-- No wake message: the daemon promoting is the one that claims from this
-- partition (see src/fleet.rs), and tells its claim loop itself.
if moved > 0 then rcall('RPUSH', KEYS[2], unpack(ids)) end

local next_due
if #buckets > 0 then
  next_due = next_wake(prefix, KEYS[1])
else
  next_due = tonumber(rcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2])
  if not next_due or (wheel_head and wheel_head < next_due) then next_due = wheel_head end
end
next_due = next_due or -1
return {moved, next_due, now}
