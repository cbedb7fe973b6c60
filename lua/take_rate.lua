--[[
  Take up to N tokens of a host's request budget for the current window, a
  budget every daemon shares: the window is the Redis clock divided into
  slices of W ms, each allowing B requests in all. A daemon asks for a chunk
  and spends it locally, so this runs a few times a second per busy host,
  never once per request.

  Input:
    KEYS[1] rate hash   <ns>:rate:{<host>}  (fields w = window number, n = taken),
            or a tenant's create budget <ns>:tenant-rate:{<tenant>}
    ARGV[1] W, window length in ms
    ARGV[2] B, requests allowed per window (all daemons together)
    ARGV[3] N, tokens wanted
  Output:
    {granted, window_end_ms}: granted is 0..N; the tokens are good until
    window_end_ms (Redis clock).
]]
local rcall = redis.call
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local w_len = tonumber(ARGV[1])
local window = math.floor(now / w_len)
local f = rcall('HMGET', KEYS[1], 'w', 'n')
local taken = 0
if tonumber(f[1]) == window then taken = tonumber(f[2]) or 0 end
local granted = math.min(tonumber(ARGV[3]), tonumber(ARGV[2]) - taken)
if granted < 0 then granted = 0 end
rcall('HSET', KEYS[1], 'w', window, 'n', taken + granted)
rcall('PEXPIRE', KEYS[1], w_len * 2)
return {granted, (window + 1) * w_len}
