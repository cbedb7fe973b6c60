--[[
  Claim up to N ready jobs for attempts: each gets a lease in the in-flight set
  and its attempt counter (which is also the lease's fencing token) goes up.
  Ids whose job is no longer `ready` (cancelled while queued, or expired), or
  whose record has no spec (a bare record left by hand; it is deleted), are
  dropped from the list without being claimed.

  Input:
    KEYS[1] ready list      <ns>:{p}:ready
    KEYS[2] inflight zset   <ns>:{p}:inflight
    ARGV[1] N, the most jobs to claim
    ARGV[2] job key prefix  <ns>:{p}:job:  (job hashes of the same hash tag)
    ARGV[3] default lease in ms
  Output:
    {now, more, id1, attempt1, due1, spec1, id2, ...}: `more` is 1 when N ids
    were taken (the list may hold more), 0 when the list ran dry.
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local rcall = redis.call
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Formatted once: a Lua number passed to redis.call is formatted on every call.
local now_s = tostring(now)
local want = tonumber(ARGV[1])

local out = {now, 0}
-- (LRANGE 0 -1 would be the whole list.)
if want < 1 then return out end
local ids = rcall('LRANGE', KEYS[1], 0, want - 1)
if #ids == 0 then return out end
if #ids == want then out[2] = 1 end

-- Read pass: every job record before the first write (see the prelude).
local fields = {}
for i, id in ipairs(ids) do
  local f = rcall('HMGET', ARGV[2] .. id, 'state', 'att', 'due', 'job', 'lease')
  if not f[1] and slot_moving_once(KEYS[1]) then return try_again() end
  fields[i] = f
end
rcall('LTRIM', KEYS[1], #ids, -1)

local leases = {}
for i, id in ipairs(ids) do
  local key = ARGV[2] .. id
  local f = fields[i]
  if f[1] and not f[4] then
    -- A bare record (its job was deleted by hand): nothing to deliver.
    rcall('DEL', key)
  elseif f[1] == 'ready' then
    local attempt = tonumber(f[2]) + 1
    local lease = tonumber(f[5]) or tonumber(ARGV[3])
    rcall('HSET', key, 'state', 'inflight', 'att', attempt, 'ut', now_s)
    leases[#leases + 1] = now + lease
    leases[#leases + 1] = id
    out[#out + 1] = id
    out[#out + 1] = attempt
    out[#out + 1] = tonumber(f[3])
    out[#out + 1] = f[4]
  end
end
if #leases > 0 then rcall('ZADD', KEYS[2], unpack(leases)) end
return out
