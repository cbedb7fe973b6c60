--[[
  Create jobs of one partition, each idempotently by id, in one call (the
  batch API sends one call per partition touched; a single create is a batch
  of one). Each job is atomic on its own and the outcome of one does not
  depend on the others, except that a later duplicate of an id in the same
  call sees the earlier one as existing.

  A job due now (or in the past) goes straight to the ready list; a later one
  goes to the due set under the member `<seq hex(12)><id>`, so jobs due in the
  same millisecond keep their enqueue order, or, when due far ahead, to a
  bucket of the timing wheel (see the prelude) with its sequence in its record.

  Input:
    KEYS[1] due zset        <ns>:{p}:due
    KEYS[2] ready list      <ns>:{p}:ready
    KEYS[3] sequence        <ns>:{p}:seq
    ARGV[1] job key prefix  <ns>:{p}:job:  (same hash tag; records as the prelude lays them out)
    ARGV[2] wake channel
    ARGV[3] partition number
    ARGV[4] id of the first job; then, for every job, seven arguments:
    ARGV[5] its spec JSON (canonical; compared byte for byte on re-create)
    ARGV[6] its absolute due time in epoch ms, or "" for relative
    ARGV[7] its delay in ms (used when the due time is "")
    ARGV[8] its max attempts (rungs + 1)
    ARGV[9] its lease in ms, or "" for the daemon default
    ARGV[10] its given due time, as the record header keeps it (see the
            prelude; the spec JSON leaves run_at and delay out)
  Keys built here (same hash tag): the live record hashes `<ns>:{p}:jobs:*`
  and kept records `<ns>:{p}:job:<id>`, read, and for ids with neither the
  summary index and shards `<ns>:{p}:done*` (see the prelude); new records
  are written to the live hashes.
  Output:
    {now, code1, state1, due1, code2, ...}, per job in order:
    code (of the prelude) DONE created, UNCHANGED an identical job exists,
    CHANGED the id exists with different content (nothing changed),
    SUMMARIZED the id belongs to a finished job's summary (nothing changed):
    then `due` is the summary's content digest, which the caller compares
    with the job's own (computed only in this rare case).
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local rcall = redis.call
local now = now_ms()

-- Pass 1: decide each job's outcome and due time.
local out = {now}
local created = {}   -- {ARGV index, state code, due} of each job to create
local seen = {}      -- id -> {spec, state name, due} of jobs created in this call
local scheduled = 0
local prefix = partition_prefix(ARGV[1], 'job:')
local done_index = nil -- the partition's summary buckets, read once if needed
for i = 4, #ARGV, 7 do
  local id, spec = ARGV[i], ARGV[i + 1]
  local existing = nil
  local earlier = seen[id]
  if earlier then
    existing = {earlier[1] == spec .. ARGV[i + 6], earlier[2], earlier[3]}
  else
    local r = rec_get(live(prefix, id)) or rec_get(kept(prefix, id))
    if r then
      existing = {r.spec == spec and r.given == tonumber(ARGV[i + 6]), state_name(r, now),
        r.due}
    else
      -- A finished job may live on as a summary, which knows only its
      -- content's digest.
      done_index = done_index or rcall('HGETALL', prefix .. 'done')
      local s = #done_index > 0 and summary_find(prefix, id, now, done_index)
      if s then
        existing = {3, STATE_NAMES[s.state], s.digest}
      elseif slot_moving_once(KEYS[1]) then
        -- The id may exist on the other node of the migration.
        return try_again()
      end
    end
  end
  if existing then
    local code = CHANGED
    if existing[1] == 3 then code = SUMMARIZED elseif existing[1] then code = UNCHANGED end
    out[#out + 1] = code
    out[#out + 1] = existing[2]
    out[#out + 1] = existing[3]
  else
    local due
    if ARGV[i + 2] ~= '' then due = tonumber(ARGV[i + 2]) else due = now + tonumber(ARGV[i + 3]) end
    local state = 'r'
    if due > now then
      state = 's'
      scheduled = scheduled + 1
    end
    seen[id] = {spec .. ARGV[i + 6], STATE_NAMES[state], due}
    created[#created + 1] = {i, state, due}
    out[#out + 1] = DONE
    out[#out + 1] = STATE_NAMES[state]
    out[#out + 1] = due
  end
end

-- Pass 2: write. One INCRBY for the sequence numbers, one ZADD, one RPUSH
-- per wheel bucket and one RPUSH for the ready list.
local seq = 0
if scheduled > 0 then seq = rcall('INCRBY', KEYS[3], scheduled) - scheduled end
local wake_before = scheduled > 0 and next_wake(prefix, KEYS[1])
local wake = nil
local zadd, ready = {}, {}
local to_wheel, in_wheel = wheel_batch(), 0
for _, c in ipairs(created) do
  local i, state, due = c[1], c[2], c[3]
  local id = ARGV[i]
  local r = {state = state, ut = now, att = 0, max = tonumber(ARGV[i + 4]), due = due,
    seq = 0, ct = now, lease = tonumber(ARGV[i + 5]) or 0, given = tonumber(ARGV[i + 6])}
  if state == 'r' then
    ready[#ready + 1] = id
  else
    seq = seq + 1
    r.seq = seq
    local slot, opens = wheel_slot(due, now)
    if slot then
      r.state = 'w'
      in_wheel = in_wheel + 1
      wheel_batch_add(to_wheel, slot, opens, id)
    else
      -- Formatted once, as an integer: a Lua number passed to redis.call is
      -- formatted with %.17g.
      zadd[#zadd + 1] = string.format('%d', due)
      zadd[#zadd + 1] = due_member(seq, id)
      if not wake or due < wake then wake = due end
    end
  end
  rec_create(live(prefix, id), r, ARGV[i + 1])
end
local opens = wheel_batch_push(prefix, to_wheel)
if opens and (not wake or opens < wake) then wake = opens end
wheel_count(prefix, in_wheel)
if #zadd > 0 then rcall('ZADD', KEYS[1], unpack(zadd)) end
if wake and (not wake_before or wake < wake_before) then wake_due(ARGV[2], ARGV[3], wake) end
if #ready > 0 and rcall('RPUSH', KEYS[2], unpack(ready)) == #ready then
  wake_ready(ARGV[2], ARGV[3])
end
return out
