--[[
  Move due jobs from the due set to the ready list, a bounded batch at a time.

  Input:
    KEYS[1] due zset        <ns>:{p}:due
    KEYS[2] ready list      <ns>:{p}:ready
    ARGV[1] batch size (at most this many jobs are moved)
    ARGV[2] job key prefix  <ns>:{p}:job:  (job records of the same hash tag)
    ARGV[3] wake channel
    ARGV[4] partition number
  Output:
    {moved, next_due, now}: next_due is the score of the earliest job left in
    the due set, or -1 when it is empty.
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local rcall = redis.call
local now = now_ms()

local members = rcall('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
-- Read pass (in a cluster): every job record must be here before anything
-- is written. A member whose record is gone outside a migration (deleted by
-- hand) is only dropped from the due set.
local ids = {}
for _, member in ipairs(members) do
  local id = string.sub(member, 13)
  if not IN_CLUSTER or rcall('EXISTS', ARGV[2] .. id) == 1 then
    ids[#ids + 1] = id
  elseif slot_moving_once(KEYS[1]) then
    return try_again()
  end
end
local moved = #ids
for _, id in ipairs(ids) do
  -- `seq` stays: it only means something while the state is scheduled.
  rec_set_state(ARGV[2] .. id, 'r', now)
end
if #members > 0 then rcall('ZREM', KEYS[1], unpack(members)) end
if moved > 0 and rcall('RPUSH', KEYS[2], unpack(ids)) == moved then
  wake_ready(ARGV[3], ARGV[4])
end

local head = rcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local next_due = -1
if head[2] then next_due = tonumber(head[2]) end
return {moved, next_due, now}
