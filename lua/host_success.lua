--[[
  Record that a host answered (a 2xx, or any answer the breaker does not
  count as a failure): its run of consecutive failures ends. A successful
  half-open probe closes the host; its parked jobs are then drained by the
  daemons (the host stays in the blocked set, due now, until drained).

  Input:
    KEYS[1] host record     <ns>:{hosts}:host:<host>
    KEYS[2] blocked zset    <ns>:{hosts}:blocked
    KEYS[3] known zset      <ns>:{hosts}:known
    ARGV[1] host
    ARGV[2] 1 when this attempt was the half-open probe, else 0
    ARGV[3] wake channel
  Output:
    {state, 1 when the host closed now else 0}
]]
local rcall = redis.call
local state = rcall('HGET', KEYS[1], 'state') or 'closed'
if state == 'half_open' and ARGV[2] == '1' then
  local t = rcall('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  rcall('HSET', KEYS[1], 'state', 'closed', 'fails', 0, 'open_for', 0,
    'next_probe_at', 0, 'probe_until', 0, 'reason', '', 'ut', now)
  rcall('ZADD', KEYS[2], now, ARGV[1])
  rcall('ZADD', KEYS[3], now, ARGV[1])
  rcall('PUBLISH', ARGV[3], 'h' .. ARGV[1])
  return {'closed', 1}
end
if state == 'closed' and rcall('EXISTS', KEYS[1]) == 1 then
  rcall('HSET', KEYS[1], 'fails', 0)
end
return {state, 0}
