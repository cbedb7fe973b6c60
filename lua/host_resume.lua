--[[
  Close a paused or open host: by an operator (`operator`, any pause or open
  state), or when a timed pause has run out (`expired`, only a paused host
  whose end has passed). Its failures are forgotten and its parked jobs are
  drained by the daemons (the host stays in the blocked set, due now, until
  drained).

  Input:
    KEYS[1] host record     <ns>:{hosts}:host:<host>
    KEYS[2] blocked zset    <ns>:{hosts}:blocked
    KEYS[3] known zset      <ns>:{hosts}:known
    ARGV[1] host
    ARGV[2] "operator" or "expired"
    ARGV[3] wake channel
  Output:
    DONE closed now, UNCHANGED not (already closed, or the pause has not
    run out; codes of the prelude)
]]
local rcall = redis.call
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = rcall('HMGET', KEYS[1], 'state', 'next_probe_at')
local state = f[1] or 'closed'
if state == 'closed' then return UNCHANGED end
if ARGV[2] == 'expired' then
  local till = tonumber(f[2]) or 0
  if state ~= 'paused' or till == 0 or now < till then return UNCHANGED end
end
rcall('HSET', KEYS[1], 'state', 'closed', 'fails', 0, 'open_for', 0, 'next_probe_at', 0,
  'probe_until', 0, 'reason', '', 'ut', now)
rcall('ZADD', KEYS[2], now, ARGV[1])
rcall('ZADD', KEYS[3], now, ARGV[1])
rcall('PUBLISH', ARGV[3], 'h' .. ARGV[1])
return DONE
