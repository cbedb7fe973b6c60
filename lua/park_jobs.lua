--[[
  Hold claimed jobs for their host while it is open (circuit breaker) or
  paused: each leaves the in-flight set and waits in the host's parking of
  this partition, scored by its due time, costing nothing until the host
  closes and the parking is drained (unpark_jobs). The attempt counter goes
  back down (no attempt was made). A parked job reads as `scheduled`, with
  no due-set member and a `park` field naming the host; cancel and PATCH
  work on it as on any scheduled job. Stale leases are skipped.

  Input:
    KEYS[1] inflight zset     <ns>:{p}:inflight
    KEYS[2] parking zset      <ns>:{p}:park:<host>
    KEYS[3] parked-hosts set  <ns>:{p}:parked
    ARGV[1] job key prefix    <ns>:{p}:job:  (job hashes of the same hash tag)
    ARGV[2] host              scheme://host:port
    ARGV[3] id, ARGV[4] fencing token (the attempt the lease was granted
    for); repeated per job
  Output:
    the number of jobs parked
]]
local rcall = redis.call
local t = rcall('TIME')
local now_s = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))

-- Read pass: every job record before the first write (see the prelude).
local fields = {}
for i = 3, #ARGV, 2 do
  local f = rcall('HMGET', ARGV[1] .. ARGV[i], 'state', 'att', 'due')
  if not f[1] and slot_moving_once(KEYS[1]) then return try_again() end
  fields[i] = f
end

local parked = 0
for i = 3, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local f = fields[i]
  if f[1] == 'inflight' and f[2] == token then
    rcall('ZREM', KEYS[1], id)
    rcall('HSET', ARGV[1] .. id, 'state', 'scheduled', 'att', tonumber(token) - 1,
      'park', ARGV[2], 'ut', now_s)
    rcall('HDEL', ARGV[1] .. id, 'seq')
    rcall('ZADD', KEYS[2], tonumber(f[3]) or 0, id)
    parked = parked + 1
  end
end
if parked > 0 then rcall('SADD', KEYS[3], ARGV[2]) end
return parked
