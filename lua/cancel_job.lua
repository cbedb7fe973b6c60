--[[
  Cancel a job that has not finished. A scheduled job leaves the due set; a job
  in flight leaves the in-flight set (its attempt's outcome will be discarded
  as stale, so it is not retried); a ready job's id stays in the ready list as
  a tombstone that claim_ready skips (no LREM on a long list).

  Input:
    KEYS[1] job hash        <ns>:{p}:job:<id>
    KEYS[2] due zset        <ns>:{p}:due
    KEYS[3] inflight zset   <ns>:{p}:inflight
    KEYS[4] history list    <ns>:{p}:hist:<id>
    ARGV[1] id
    ARGV[2] retention in ms
    ARGV[3] wake channel (a leased job's cancel is announced as x<id>, so a
            daemon holding it for its host drops it before its attempt)
  Output:
     1 cancelled now
     0 was already cancelled (nothing changed)
    -1 no such job
    -2 already delivered or dead (nothing changed)
]]
local rcall = redis.call
local f = rcall('HMGET', KEYS[1], 'state', 'seq')
local state = f[1]
if not state then return -1 end
if state == 'cancelled' then return 0 end
if state == 'delivered' or state == 'dead' then return -2 end

if state == 'scheduled' and f[2] then
  rcall('ZREM', KEYS[2], f[2] .. ARGV[1])
elseif state == 'inflight' then
  rcall('ZREM', KEYS[3], ARGV[1])
  rcall('PUBLISH', ARGV[3], 'x' .. ARGV[1])
end
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
rcall('HSET', KEYS[1], 'state', 'cancelled', 'ut', now)
rcall('HDEL', KEYS[1], 'seq')
rcall('PEXPIRE', KEYS[1], ARGV[2])
rcall('PEXPIRE', KEYS[4], ARGV[2])
return 1
