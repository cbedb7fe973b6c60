--[[
  Count a failed attempt (connection error, timeout, 5xx, 429) against its
  host, for the circuit breaker every daemon shares. The Nth consecutive
  failure of a closed host opens it: its jobs then wait (parked) until a
  probe, due open_for later. A failed probe reopens the host for twice as
  long, up to max_open. A paused host only counts.

  Input:
    KEYS[1] host record     <ns>:{hosts}:host:<host>
    KEYS[2] blocked zset    <ns>:{hosts}:blocked  (score: when a daemon must next act)
    KEYS[3] known zset      <ns>:{hosts}:known    (score: last change)
    ARGV[1] host
    ARGV[2] consecutive failures that open the host (0: the breaker is off)
    ARGV[3] open_for in ms
    ARGV[4] max_open in ms
    ARGV[5] reason (the failure, e.g. "timeout")
    ARGV[6] 1 when this attempt was the half-open probe, else 0
    ARGV[7] wake channel
  Output:
    {state, consecutive failures, 1 when the host opened now else 0}
]]
local rcall = redis.call
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = rcall('HMGET', KEYS[1], 'state', 'open_for')
local state = f[1] or 'closed'
local fails = rcall('HINCRBY', KEYS[1], 'fails', 1)
-- A pause keeps its own reason.
if state ~= 'paused' then rcall('HSET', KEYS[1], 'reason', ARGV[5], 'ut', now) end
rcall('ZADD', KEYS[3], now, ARGV[1])

local function open(period)
  local probe_at = now + period
  rcall('HSET', KEYS[1], 'state', 'open', 'opened_at', now, 'open_for', period,
    'next_probe_at', probe_at, 'probe_until', 0)
  rcall('ZADD', KEYS[2], probe_at, ARGV[1])
  rcall('PUBLISH', ARGV[7], 'h' .. ARGV[1])
  return {'open', fails, 1}
end

if state == 'half_open' and ARGV[6] == '1' then
  local period = math.min((tonumber(f[2]) or tonumber(ARGV[3])) * 2, tonumber(ARGV[4]))
  return open(period)
end
local threshold = tonumber(ARGV[2])
if state == 'closed' and threshold > 0 and fails >= threshold then
  return open(tonumber(ARGV[3]))
end
return {state, fails, 0}
