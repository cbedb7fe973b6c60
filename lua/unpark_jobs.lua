--[[
  Drain up to N jobs of a host's parking in this partition, oldest due first,
  back into the due set with their own due times (already past: the carrier
  promotes them in due order). Ids whose job was cancelled, rescheduled or
  re-parked elsewhere meanwhile are dropped. The host leaves the partition's
  parked-hosts set when its parking is empty.

  Input:
    KEYS[1] parking zset      <ns>:{p}:park:<host>
    KEYS[2] parked-hosts set  <ns>:{p}:parked
    KEYS[3] due zset          <ns>:{p}:due
    KEYS[4] sequence          <ns>:{p}:seq
    ARGV[1] job key prefix    <ns>:{p}:job:
    ARGV[2] host
    ARGV[3] N, the most jobs to move
    ARGV[4] wake channel
    ARGV[5] partition number
  Output:
    {moved, left}: jobs moved to the due set, jobs still parked here
]]
local rcall = redis.call
local head = rcall('ZRANGE', KEYS[1], 0, tonumber(ARGV[3]) - 1, 'WITHSCORES')
-- Read pass: every job record before the first write (see the prelude).
local fields = {}
for i = 1, #head, 2 do
  local f = rcall('HMGET', ARGV[1] .. head[i], 'state', 'seq', 'park', 'due')
  if not f[1] and slot_moving_once(KEYS[1]) then return try_again() end
  fields[i] = f
end
if #head > 0 then rcall('ZREMRANGEBYRANK', KEYS[1], 0, #head / 2 - 1) end

local moved, earliest = 0, nil
local t = rcall('TIME')
local now_s = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
for i = 1, #head, 2 do
  local id = head[i]
  local f = fields[i]
  if f[1] == 'scheduled' and not f[2] and f[3] == ARGV[2] then
    local due = tonumber(f[4]) or tonumber(head[i + 1])
    local seq = string.format('%012x', rcall('INCR', KEYS[4]))
    rcall('HSET', ARGV[1] .. id, 'seq', seq, 'ut', now_s)
    rcall('HDEL', ARGV[1] .. id, 'park')
    rcall('ZADD', KEYS[3], due, seq .. id)
    if not earliest or due < earliest then earliest = due end
    moved = moved + 1
  end
end
local left = rcall('ZCARD', KEYS[1])
if left == 0 then rcall('SREM', KEYS[2], ARGV[2]) end
if earliest then rcall('PUBLISH', ARGV[4], 'd' .. ARGV[5] .. ':' .. earliest) end
return {moved, left}
