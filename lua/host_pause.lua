--[[
  Pause a host: its jobs wait (parked) without being attempted. An operator's
  pause (until = 0) lasts until resumed; a pause asked for by a receiver's
  Retry-After lasts until `until` and never shortens a pause already longer
  (nor replaces an operator's).

  Input:
    KEYS[1] host record     <ns>:{hosts}:host:<host>
    KEYS[2] blocked zset    <ns>:{hosts}:blocked
    KEYS[3] known zset      <ns>:{hosts}:known
    ARGV[1] host
    ARGV[2] until, epoch ms (0: until resumed)
    ARGV[3] reason ("operator", "retry_after")
    ARGV[4] wake channel
  Output:
    DONE paused now (or extended), UNCHANGED not (codes of the prelude)
]]
local rcall = redis.call
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = rcall('HMGET', KEYS[1], 'state', 'next_probe_at')
local till = tonumber(ARGV[2])
if f[1] == 'paused' then
  local current = tonumber(f[2]) or 0
  if current == 0 and till ~= 0 then return UNCHANGED end
  if till ~= 0 and current >= till then return UNCHANGED end
  if till == 0 and current == 0 then return UNCHANGED end
end
-- A paused host with no end is listed last among the blocked (score +inf).
local score = till
if till == 0 then score = '+inf' end
rcall('HSET', KEYS[1], 'state', 'paused', 'next_probe_at', till, 'probe_until', 0,
  'reason', ARGV[3], 'opened_at', now, 'ut', now)
rcall('ZADD', KEYS[2], score, ARGV[1])
rcall('ZADD', KEYS[3], now, ARGV[1])
rcall('PUBLISH', ARGV[4], 'h' .. ARGV[1])
return DONE
