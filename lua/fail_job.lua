--[[
  Record a failed attempt: either schedule the next rung (back to the due set)
  or dead-letter the job (out of the live sets and onto the dead-letter stream,
  in this same atomic step).

  Input:
    KEYS[1] job hash        <ns>:{p}:job:<id>
    KEYS[2] inflight zset   <ns>:{p}:inflight
    KEYS[3] history list    <ns>:{p}:hist:<id>
    KEYS[4] due zset        <ns>:{p}:due
    KEYS[5] sequence        <ns>:{p}:seq
    KEYS[6] dead stream     <ns>:{p}:dead
    KEYS[7] stats hash      <ns>:{p}:stats
    ARGV[1] id
    ARGV[2] fencing token (the attempt number the lease was granted for)
    ARGV[3] attempt record JSON
    ARGV[4] retry delay in ms, or -1 to dead-letter
    ARGV[5] retention in ms (for a dead job's record)
    ARGV[6] last error (kind: message)
    ARGV[7] last HTTP status, or ""
    ARGV[8] topic
    ARGV[9] dead-letter stream cap (approximate MAXLEN)
    ARGV[10] wake channel
    ARGV[11] partition number
  Output:
    {1, next_due}   retry scheduled at next_due (epoch ms)
    {2, entry_id}   dead-lettered as stream entry entry_id
    {0}             stale: the lease was taken over or the job was cancelled
]]
local rcall = redis.call
local f = rcall('HMGET', KEYS[1], 'state', 'att', 'job')
if f[1] ~= 'inflight' or f[2] ~= ARGV[2] then return {0} end

local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
rcall('ZREM', KEYS[2], ARGV[1])
rcall('LPUSH', KEYS[3], ARGV[3])
rcall('LTRIM', KEYS[3], 0, 19)
rcall('HINCRBY', KEYS[7], 'failed_attempts', 1)

local delay = tonumber(ARGV[4])
if delay >= 0 then
  local due = now + delay
  local seq = string.format('%012x', rcall('INCR', KEYS[5]))
  local member = seq .. ARGV[1]
  rcall('HSET', KEYS[1], 'state', 'scheduled', 'due', due, 'seq', seq, 'ut', now)
  rcall('ZADD', KEYS[4], due, member)
  local head = rcall('ZRANGE', KEYS[4], 0, 0)
  if head[1] == member then
    rcall('PUBLISH', ARGV[10], 'd' .. ARGV[11] .. ':' .. due)
  end
  return {1, due}
end

local entry = rcall('XADD', KEYS[6], 'MAXLEN', '~', ARGV[9], '*',
  'id', ARGV[1], 'topic', ARGV[8], 'attempts', f[2], 'last_error', ARGV[6],
  'last_status', ARGV[7], 'job', f[3], 'dead_at', now)
rcall('HSET', KEYS[1], 'state', 'dead', 'dl', entry, 'ut', now)
rcall('PEXPIRE', KEYS[1], ARGV[5])
rcall('PEXPIRE', KEYS[3], ARGV[5])
rcall('HINCRBY', KEYS[7], 'dead_lettered', 1)
return {2, entry}
