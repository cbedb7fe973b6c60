--[[
  Claim up to N ready jobs for attempts: each gets a lease in the in-flight set
  and its attempt counter (which is also the lease's fencing token) goes up.
  A job is ready when its record says so or, promoted by promote_due (which
  leaves the record alone), says `scheduled` with its due time passed. Ids
  whose job is no longer ready (cancelled while queued, or expired), or
  whose record has no spec (a bare record left by hand; it is deleted), are
  dropped from the list without being claimed.

  With a promotion batch, due jobs are first promoted (promote_due_jobs in
  the prelude), so that the daemon that has the partition claims a job that
  just came due in one call.

  Input:
    KEYS[1] ready list      <ns>:{p}:ready
    KEYS[2] inflight zset   <ns>:{p}:inflight
    KEYS[3] due zset        <ns>:{p}:due
    KEYS[4] wheel index     <ns>:{p}:wheel
    ARGV[1] N, the most jobs to claim
    ARGV[2] job key prefix  <ns>:{p}:job:  (its partition's live record hashes
            `<ns>:{p}:jobs:*` are built from it)
    ARGV[3] default lease in ms
    ARGV[4] promotion batch: promote up to this many due jobs first (0: none)
  Output:
    {now, more, moved, next_due, id1, attempt1, due1, spec1, id2, ...}:
    `more` is 1 when N ids were taken (the list may hold more), 0 when the
    list ran dry; `moved` and `next_due` as promote_due answers them, or -1
    and -2 without a promotion.
    TRYAGAIN while the partition's slot is migrating: nothing was claimed
    (a promotion made before stands; it is a change of its own).
]]
local rcall = redis.call
local now = now_ms()
local want = tonumber(ARGV[1])

local out = {now, 0, -1, -2}
local promote = tonumber(ARGV[4])
if promote > 0 then
  local moved, next_due = promote_due_jobs(KEYS[3], KEYS[1], KEYS[4], promote, now)
  if not moved then return try_again() end
  out[3], out[4] = moved, next_due
end
-- (LRANGE 0 -1 would be the whole list.)
if want < 1 then return out end
local ids = rcall('LRANGE', KEYS[1], 0, want - 1)
if #ids == 0 then return out end
if #ids == want then out[2] = 1 end

-- Read pass: every job record before the first write (see the prelude).
local prefix = partition_prefix(ARGV[2], 'job:')
local records, places = {}, {}
for i, id in ipairs(ids) do
  local at = live(prefix, id)
  places[i] = at
  local v = rcall('HGET', at.h, id)
  if not v and slot_moving_once(KEYS[1]) then return try_again() end
  records[i] = v or false
end
rcall('LTRIM', KEYS[1], #ids, -1)

local leases, taken = {}, {}
for i, id in ipairs(ids) do
  local at = places[i]
  local v = records[i]
  local r = v and rec_unpack(v)
  if v and not r then
    -- A bare record (its job was deleted by hand): nothing to deliver.
    rec_delete(at)
  elseif r and rec_ready(r, now) and not taken[id] then
    taken[id] = true
    local attempt = r.att + 1
    local lease = r.lease
    if lease == 0 then lease = tonumber(ARGV[3]) end
    rec_patch(at, v, struct.pack('>c1I6I2', 'i', now, attempt))
    leases[#leases + 1] = now + lease
    leases[#leases + 1] = id
    out[#out + 1] = id
    out[#out + 1] = attempt
    out[#out + 1] = r.due
    out[#out + 1] = string.sub(v, REC_HEADER + 1)
  end
end
if #leases > 0 then rcall('ZADD', KEYS[2], unpack(leases)) end
return out
