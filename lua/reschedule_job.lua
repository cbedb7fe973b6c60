--[[
  Replace a scheduled job's content and/or due time. Only a job that is still
  `scheduled` changes; once the carrier has promoted it (or it is in flight or
  finished) the answer is a conflict and nothing changes.

  Input:
    KEYS[1] job hash        <ns>:{p}:job:<id>
    KEYS[2] due zset        <ns>:{p}:due
    KEYS[3] ready list      <ns>:{p}:ready
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
  Output:
    {1, state, due, now}   changed
    {-1}                   no such job
    {-2, state}            not scheduled (nothing changed)
    {-3, state}            changed by someone else since it was read (nothing changed)
]]
local rcall = redis.call
local f = rcall('HMGET', KEYS[1], 'state', 'seq', 'due', 'job')
if not f[1] then return {-1} end
if f[1] ~= 'scheduled' then return {-2, f[1]} end
if f[4] ~= ARGV[9] then return {-3, f[1]} end

local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due
if ARGV[3] == 'keep' then
  due = tonumber(f[3])
elseif ARGV[3] ~= '' then
  due = tonumber(ARGV[3])
else
  due = now + tonumber(ARGV[4])
end

-- A job held for its host (parked) has no due-set member; it leaves the
-- host's parking as it joins the due set (the parked id is skipped later).
if f[2] then rcall('ZREM', KEYS[2], f[2] .. ARGV[1]) end
rcall('HDEL', KEYS[1], 'park')
rcall('HSET', KEYS[1], 'job', ARGV[2], 'max', ARGV[5], 'due', due, 'ut', now)
if ARGV[6] ~= '' then
  rcall('HSET', KEYS[1], 'lease', ARGV[6])
else
  rcall('HDEL', KEYS[1], 'lease')
end

local state
if due <= now then
  state = 'ready'
  rcall('HSET', KEYS[1], 'state', state)
  rcall('HDEL', KEYS[1], 'seq')
  if rcall('RPUSH', KEYS[3], ARGV[1]) == 1 then
    rcall('PUBLISH', ARGV[7], 'r' .. ARGV[8])
  end
else
  state = 'scheduled'
  local seq = string.format('%012x', rcall('INCR', KEYS[4]))
  local member = seq .. ARGV[1]
  rcall('HSET', KEYS[1], 'seq', seq)
  rcall('ZADD', KEYS[2], due, member)
  local head = rcall('ZRANGE', KEYS[2], 0, 0)
  if head[1] == member then
    rcall('PUBLISH', ARGV[7], 'd' .. ARGV[8] .. ':' .. due)
  end
end
return {1, state, due, now}
