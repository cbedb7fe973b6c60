--[[
  Create jobs of one partition, each idempotently by id, in one call (the
  batch API sends one call per partition touched; a single create is a batch
  of one). Each job is atomic on its own and the outcome of one does not
  depend on the others, except that a later duplicate of an id in the same
  call sees the earlier one as existing.

  A job due now (or in the past) goes straight to the ready list; a later one
  goes to the due set under the member `<seq hex(12)><id>`, so jobs due in the
  same millisecond keep their enqueue order.

  Input:
    KEYS[1] due zset        <ns>:{p}:due
    KEYS[2] ready list      <ns>:{p}:ready
    KEYS[3] sequence        <ns>:{p}:seq
    ARGV[1] job key prefix  <ns>:{p}:job:  (same hash tag)
    ARGV[2] wake channel
    ARGV[3] partition number
    ARGV[4] id of the first job; then, for every job, six arguments:
    ARGV[5] its spec JSON (canonical; compared byte for byte on re-create)
    ARGV[6] its absolute due time in epoch ms, or "" for relative
    ARGV[7] its delay in ms (used when the due time is "")
    ARGV[8] its max attempts (rungs + 1)
    ARGV[9] its lease in ms, or "" for the daemon default
  Output:
    {now, code1, state1, due1, code2, ...}, per job in order:
    code 0 created, 1 an identical job exists (nothing changed), 2 the id
    exists with different content (nothing changed).
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local rcall = redis.call
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_s = tostring(now)

-- Pass 1: decide each job's outcome and due time.
local out = {now}
local created = {}   -- index into ARGV of each job to create
local seen = {}      -- id -> {spec, state, due} of jobs created in this call
local scheduled = 0
for i = 4, #ARGV, 6 do
  local id, spec = ARGV[i], ARGV[i + 1]
  local prior = seen[id]
  local existing
  if prior then
    existing = prior
  else
    local f = rcall('HMGET', ARGV[1] .. id, 'job', 'state', 'due')
    if f[1] then
      existing = {f[1], f[2], tonumber(f[3]) or 0}
    elseif slot_moving_once(KEYS[1]) then
      -- The id may exist on the other node of the migration.
      return try_again()
    end
  end
  if existing then
    local code = 2
    if existing[1] == spec then code = 1 end
    out[#out + 1] = code
    out[#out + 1] = existing[2]
    out[#out + 1] = existing[3]
  else
    local due
    if ARGV[i + 2] ~= '' then due = tonumber(ARGV[i + 2]) else due = now + tonumber(ARGV[i + 3]) end
    local state = 'ready'
    if due > now then
      state = 'scheduled'
      scheduled = scheduled + 1
    end
    seen[id] = {spec, state, due}
    created[#created + 1] = {i, state, due}
    out[#out + 1] = 0
    out[#out + 1] = state
    out[#out + 1] = due
  end
end

-- Pass 2: write. One INCRBY for the sequence numbers, one ZADD and one RPUSH.
local seq = 0
if scheduled > 0 then seq = rcall('INCRBY', KEYS[3], scheduled) - scheduled end
local head = rcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local earliest = head[2] and tonumber(head[2])
local new_earliest = nil
local zadd, ready = {}, {}
for _, c in ipairs(created) do
  local i, state, due = c[1], c[2], c[3]
  local id = ARGV[i]
  local key = ARGV[1] .. id
  -- Formatted once, as an integer: a Lua number passed to redis.call is
  -- formatted with %.17g on every call.
  local due_s = string.format('%d', due)
  if state == 'ready' then
    rcall('HSET', key, 'job', ARGV[i + 1], 'state', state, 'att', '0', 'max', ARGV[i + 4],
      'due', due_s, 'ct', now_s, 'ut', now_s)
    ready[#ready + 1] = id
  else
    seq = seq + 1
    local seq_hex = string.format('%012x', seq)
    rcall('HSET', key, 'job', ARGV[i + 1], 'state', state, 'att', '0', 'max', ARGV[i + 4],
      'due', due_s, 'seq', seq_hex, 'ct', now_s, 'ut', now_s)
    zadd[#zadd + 1] = due_s
    zadd[#zadd + 1] = seq_hex .. id
    if not new_earliest or due < new_earliest then new_earliest = due end
  end
  if ARGV[i + 5] ~= '' then rcall('HSET', key, 'lease', ARGV[i + 5]) end
end
if #zadd > 0 then
  rcall('ZADD', KEYS[1], unpack(zadd))
  if not earliest or new_earliest < earliest then
    rcall('PUBLISH', ARGV[2], 'd' .. ARGV[3] .. ':' .. string.format('%d', new_earliest))
  end
end
if #ready > 0 and rcall('RPUSH', KEYS[2], unpack(ready)) == #ready then
  rcall('PUBLISH', ARGV[2], 'r' .. ARGV[3])
end
return out
