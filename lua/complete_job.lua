--[[
  Record a successful attempt: the job is delivered, leaves the in-flight set,
  and its record expires after the retention period.

  Input:
    KEYS[1] job hash        <ns>:{p}:job:<id>
    KEYS[2] inflight zset   <ns>:{p}:inflight
    KEYS[3] history list    <ns>:{p}:hist:<id>
    KEYS[4] stats hash      <ns>:{p}:stats
    ARGV[1] id
    ARGV[2] fencing token (the attempt number the lease was granted for)
    ARGV[3] attempt record JSON
    ARGV[4] retention in ms
  Output:
     1 recorded
     0 stale: the lease was taken over or the job was cancelled; nothing changed
]]
local rcall = redis.call
local f = rcall('HMGET', KEYS[1], 'state', 'att')
if f[1] ~= 'inflight' or f[2] ~= ARGV[2] then return 0 end

local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
rcall('ZREM', KEYS[2], ARGV[1])
rcall('HSET', KEYS[1], 'state', 'delivered', 'ut', now)
rcall('LPUSH', KEYS[3], ARGV[3])
rcall('LTRIM', KEYS[3], 0, 19)
rcall('PEXPIRE', KEYS[1], ARGV[4])
rcall('PEXPIRE', KEYS[3], ARGV[4])
rcall('HINCRBY', KEYS[4], 'delivered', 1)
return 1
