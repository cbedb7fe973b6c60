--[[
  Give a claimed job back without attempting it (its host is at its
  concurrency limit): it leaves the in-flight set and is scheduled again after
  a short delay. The attempt counter goes back down, since no attempt was
  made; this claim produced no outcome, so its token is never used.

  Input:
    KEYS[1] job hash        <ns>:{p}:job:<id>
    KEYS[2] inflight zset   <ns>:{p}:inflight
    KEYS[3] due zset        <ns>:{p}:due
    KEYS[4] sequence        <ns>:{p}:seq
    ARGV[1] id
    ARGV[2] fencing token (the attempt number the lease was granted for)
    ARGV[3] delay in ms
    ARGV[4] wake channel
    ARGV[5] partition number
  Output:
    {1, due}  deferred until due (epoch ms)
    {0}       stale: the lease was taken over or the job cancelled
]]
local rcall = redis.call
local f = rcall('HMGET', KEYS[1], 'state', 'att')
if f[1] ~= 'inflight' or f[2] ~= ARGV[2] then return {0} end

local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = now + tonumber(ARGV[3])
local seq = string.format('%012x', rcall('INCR', KEYS[4]))
local member = seq .. ARGV[1]
rcall('ZREM', KEYS[2], ARGV[1])
rcall('HSET', KEYS[1], 'state', 'scheduled', 'att', tonumber(f[2]) - 1, 'due', due,
  'seq', seq, 'ut', now)
rcall('ZADD', KEYS[3], due, member)
local head = rcall('ZRANGE', KEYS[3], 0, 0)
if head[1] == member then
  rcall('PUBLISH', ARGV[4], 'd' .. ARGV[5] .. ':' .. due)
end
return {1, due}
