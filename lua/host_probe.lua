--[[
  The half-open step of the breaker, in two moves. `begin`: an open host
  whose probe time has come (or a half-open one whose probe was lost: its
  daemon died or the probe job was cancelled) becomes half_open, and the
  caller moves one parked job back to be the probe. `take`: a daemon that
  claimed a job of a half-open host asks to run it as the probe; one daemon
  at a time gets it, for `lease` ms.

  Input:
    KEYS[1] host record     <ns>:{hosts}:host:<host>
    KEYS[2] blocked zset    <ns>:{hosts}:blocked
    ARGV[1] host
    ARGV[2] "begin" or "take"
    ARGV[3] lease in ms (how long a probe may take before it counts as lost)
    ARGV[4] wake channel
  Output:
    DONE granted, UNCHANGED not (nothing changed; codes of the prelude)
]]
local rcall = redis.call
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = rcall('HMGET', KEYS[1], 'state', 'next_probe_at', 'probe_until')
local state = f[1]
local lease = tonumber(ARGV[3])
if ARGV[2] == 'begin' then
  local due = tonumber(f[2]) or 0
  if (state == 'open' or state == 'half_open') and now >= due then
    rcall('HSET', KEYS[1], 'state', 'half_open', 'next_probe_at', now + lease,
      'probe_until', 0, 'ut', now)
    rcall('ZADD', KEYS[2], now + lease, ARGV[1])
    rcall('PUBLISH', ARGV[4], 'h' .. ARGV[1])
    return DONE
  end
  return UNCHANGED
end
if state == 'half_open' and now >= (tonumber(f[3]) or 0) then
  rcall('HSET', KEYS[1], 'probe_until', now + lease, 'next_probe_at', now + lease)
  rcall('ZADD', KEYS[2], now + lease, ARGV[1])
  return DONE
end
return UNCHANGED
