--[[
  Record successful attempts of one partition in one call: each job whose
  lease is still current becomes delivered, leaves the in-flight set, and its
  record and history expire after the retention period. Batching is what lets
  a busy daemon record thousands of deliveries a second without one script
  call (and one TIME, ZREM, HINCRBY) per job.

  Input:
    KEYS[1] inflight zset   <ns>:{p}:inflight
    KEYS[2] stats hash      <ns>:{p}:stats
    ARGV[1] job key prefix      <ns>:{p}:job:   (same hash tag)
    ARGV[2] history key prefix  <ns>:{p}:hist:  (same hash tag)
    ARGV[3] retention in ms
    ARGV[4] id of the first job; then, for every job, three arguments:
    ARGV[5] its fencing token (the attempt number the lease was granted for)
    ARGV[6] its attempt record JSON
  Output:
    {r1, r2, ...} one per job, in order: 1 recorded, 0 stale (the lease was
    taken over or the job was cancelled; nothing changed for that job).
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local rcall = redis.call
local now = now_ms()
local retention = ARGV[3]

-- Read pass: every key to be written, before the first write (see the
-- prelude). A history list may rightly be absent (a first attempt).
local current = {}
for i = 4, #ARGV, 3 do
  local key, hist = ARGV[1] .. ARGV[i], ARGV[2] .. ARGV[i]
  local r = rec_header(key)
  if IN_CLUSTER and (not r or rcall('EXISTS', hist) == 0) and slot_moving_once(KEYS[1]) then
    return try_again()
  end
  current[i] = r ~= nil and r.state == 'i' and r.att == tonumber(ARGV[i + 1])
end

local out = {}
local done = {}
for i = 4, #ARGV, 3 do
  local id = ARGV[i]
  local key = ARGV[1] .. id
  if current[i] then
    local hist = ARGV[2] .. id
    rec_set_state(key, 'd', now)
    history_push(hist, ARGV[i + 2])
    rcall('PEXPIRE', key, retention)
    rcall('PEXPIRE', hist, retention)
    done[#done + 1] = id
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if #done > 0 then
  rcall('ZREM', KEYS[1], unpack(done))
  rcall('HINCRBY', KEYS[2], 'delivered', #done)
end
return out
