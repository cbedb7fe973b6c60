--[[
  Drain up to N jobs of a host's parking in this partition, oldest due first,
  back into their tenants' due sets with their own due times (already past: the carrier
  promotes them in due order). Ids whose job was cancelled, rescheduled or
  re-parked elsewhere meanwhile are dropped. The host leaves the partition's
  parked-hosts set when its parking is empty.

  Input:
    KEYS[1] parking zset      <ns>:{p}:park:<host>
    KEYS[2] parked-hosts set  <ns>:{p}:parked
    KEYS[3] due zset          <ns>:{p}:due  (the default tenant's; see
              the prelude for the other tenants' and their index)
    KEYS[4] sequence          <ns>:{p}:seq
    ARGV[1] job key prefix    <ns>:{p}:job:  (the live record hashes are built from it)
    ARGV[2] host
    ARGV[3] N, the most jobs to move
    ARGV[4] wake channel
    ARGV[5] partition number
  Output:
    {moved, left}: jobs moved to the due sets, jobs still parked here
]]
local rcall = redis.call
local head = rcall('ZRANGE', KEYS[1], 0, tonumber(ARGV[3]) - 1, 'WITHSCORES')
-- Read pass: every job record before the first write (see the prelude).
local prefix = partition_prefix(ARGV[1], 'job:')
local records, ids = {}, {}
for i = 1, #head, 2 do
  local r = rec_get(live(prefix, string.sub(head[i], 13)))
  if not r and slot_moving_once(KEYS[1]) then return try_again() end
  records[i] = r or false
  ids[#ids + 1] = string.sub(head[i], 13)
end
-- The tenants' due sets (and their index) they may join.
if due_blocked(KEYS[3], ids) then return try_again() end
if #head > 0 then rcall('ZREMRANGEBYRANK', KEYS[1], 0, #head / 2 - 1) end

local moved, earliest, to_due = 0, nil, due_batch()
local now = now_ms()
for i = 1, #head, 2 do
  local id = string.sub(head[i], 13)
  local r = records[i]
  -- Only a job still parked under this very entry: its sequence matches.
  if r and r.state == 'p' and r.seq == tonumber(string.sub(head[i], 1, 12), 16) then
    local seq = rcall('INCR', KEYS[4])
    r.state, r.seq, r.ut = 's', seq, now
    rec_put(live(prefix, id), r)
    due_batch_add(to_due, KEYS[3], id, r.due, seq, prefix)
    if not earliest or r.due < earliest then earliest = r.due end
    moved = moved + 1
  end
end
due_batch_push(KEYS[3], to_due)
local left = rcall('ZCARD', KEYS[1])
if left == 0 then rcall('SREM', KEYS[2], ARGV[2]) end
if earliest then wake_due(ARGV[4], ARGV[5], earliest) end
return {moved, left}
