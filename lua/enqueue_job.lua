--[[
  Create a job, idempotently by id.

  A job due now (or in the past) goes straight to the ready list; a later one
  goes to the due set under the member `<seq hex(12)><id>`, so jobs due in the
  same millisecond keep their enqueue order.

  Input:
    KEYS[1] job hash        <ns>:{p}:job:<id>
    KEYS[2] due zset        <ns>:{p}:due
    KEYS[3] ready list      <ns>:{p}:ready
    KEYS[4] sequence        <ns>:{p}:seq
    ARGV[1] id
    ARGV[2] job spec JSON (canonical; compared byte for byte on re-create)
    ARGV[3] absolute due time in epoch ms, or "" for relative
    ARGV[4] delay in ms (used when ARGV[3] is "")
    ARGV[5] max attempts (rungs + 1)
    ARGV[6] lease in ms for this job, or "" for the daemon default
    ARGV[7] wake channel
    ARGV[8] partition number
  Output:
    {0, state, due, now}  created
    {1, state, due, now}  an identical job exists (nothing changed)
    {2, state, due, now}  the id exists with different content (nothing changed)
]]
local rcall = redis.call
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local existing = rcall('HMGET', KEYS[1], 'job', 'state', 'due')
if existing[1] then
  local code = 2
  if existing[1] == ARGV[2] then code = 1 end
  return {code, existing[2], tonumber(existing[3]) or 0, now}
end

local due
if ARGV[3] ~= '' then due = tonumber(ARGV[3]) else due = now + tonumber(ARGV[4]) end

local state
if due <= now then
  state = 'ready'
  rcall('HSET', KEYS[1], 'job', ARGV[2], 'state', state, 'att', 0, 'max', ARGV[5],
    'due', due, 'ct', now, 'ut', now)
  if rcall('RPUSH', KEYS[3], ARGV[1]) == 1 then
    rcall('PUBLISH', ARGV[7], 'r' .. ARGV[8])
  end
else
  state = 'scheduled'
  local seq = string.format('%012x', rcall('INCR', KEYS[4]))
  local member = seq .. ARGV[1]
  rcall('HSET', KEYS[1], 'job', ARGV[2], 'state', state, 'att', 0, 'max', ARGV[5],
    'due', due, 'seq', seq, 'ct', now, 'ut', now)
  rcall('ZADD', KEYS[2], due, member)
  local head = rcall('ZRANGE', KEYS[2], 0, 0)
  if head[1] == member then
    rcall('PUBLISH', ARGV[7], 'd' .. ARGV[8] .. ':' .. due)
  end
end
if ARGV[6] ~= '' then rcall('HSET', KEYS[1], 'lease', ARGV[6]) end
return {0, state, due, now}
