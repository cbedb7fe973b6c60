--[[
  Record successful attempts of one partition in one call: each job whose
  lease is still current becomes delivered, leaves the in-flight set, and its
  record and history expire after the retention period. Batching is what lets
  a busy daemon record thousands of deliveries a second without one script
  call (and one TIME, ZREM, HINCRBY) per job.

  Input:
    KEYS[1] inflight zset   <ns>:{p}:inflight
    KEYS[2] stats hash      <ns>:{p}:stats
    ARGV[1] job key prefix      <ns>:{p}:job:   (same hash tag)
    ARGV[2] history key prefix  <ns>:{p}:hist:  (same hash tag)
    ARGV[3] retention in ms
    ARGV[4] id of the first job; then, for every job, three arguments:
    ARGV[5] its fencing token (the attempt number the lease was granted for)
    ARGV[6] its attempt record JSON
  Output:
    {r1, r2, ...} one per job, in order: 1 recorded, 0 stale (the lease was
    taken over or the job was cancelled; nothing changed for that job)
]]
local rcall = redis.call
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Formatted once: a Lua number passed to redis.call is formatted on every call.
local now_s = tostring(now)
local retention = ARGV[3]

local out = {}
local done = {}
for i = 4, #ARGV, 3 do
  local id, token = ARGV[i], ARGV[i + 1]
  local key = ARGV[1] .. id
  local f = rcall('HMGET', key, 'state', 'att')
  if f[1] == 'inflight' and f[2] == token then
    local hist = ARGV[2] .. id
    rcall('HSET', key, 'state', 'delivered', 'ut', now_s)
    if rcall('LPUSH', hist, ARGV[i + 2]) > 20 then rcall('LTRIM', hist, 0, 19) end
    rcall('PEXPIRE', key, retention)
    rcall('PEXPIRE', hist, retention)
    done[#done + 1] = id
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if #done > 0 then
  rcall('ZREM', KEYS[1], unpack(done))
  rcall('HINCRBY', KEYS[2], 'delivered', #done)
end
return out
