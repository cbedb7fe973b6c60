--[[
  Turns at draining a closed host's parked jobs, so that one daemon at a
  time drains it and a crashed drainer is replaced. `take`: the host is
  closed and due in the blocked set; the caller drains one round, and the
  turn is its own for `lease` ms. `done`: every partition's parking of the
  host is empty; it leaves the blocked set (if still closed). `note`: a
  daemon just parked jobs of the host: if it is no longer in the blocked set
  (it closed and was drained meanwhile), it is put back, due now, so its
  jobs are drained again.

  Input:
    KEYS[1] host record     <ns>:{hosts}:host:<host>
    KEYS[2] blocked zset    <ns>:{hosts}:blocked
    ARGV[1] host
    ARGV[2] "take", "done" or "note"
    ARGV[3] lease in ms
  Output:
    DONE granted / removed / put back, UNCHANGED not (codes of the prelude)
]]
local rcall = redis.call
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = rcall('HGET', KEYS[1], 'state') or 'closed'
local score = tonumber(rcall('ZSCORE', KEYS[2], ARGV[1]))
if ARGV[2] == 'note' then
  if score then return UNCHANGED end
  rcall('ZADD', KEYS[2], now, ARGV[1])
  return DONE
end
if state ~= 'closed' or not score then return UNCHANGED end
if ARGV[2] == 'take' then
  if score > now then return UNCHANGED end
  rcall('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
  return DONE
end
rcall('ZREM', KEYS[2], ARGV[1])
return DONE
