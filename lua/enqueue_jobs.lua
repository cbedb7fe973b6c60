--[[
  Create jobs of one partition, each idempotently by id, in one call (the
  batch API sends one call per partition touched; a single create is a batch
  of one). Each job is atomic on its own and the outcome of one does not
  depend on the others, except that a later duplicate of an id in the same
  call sees the earlier one as existing.

  A job due now (or in the past) goes straight to the ready list; a later one
  goes to its tenant's due set under the member `<seq hex(12)><id>`, so jobs
  due in the same millisecond keep their enqueue order, or, when due far ahead, to a
  bucket of the timing wheel (see the prelude) with its sequence in its record.
  A job with an ordering key joins the tail of its ordering list; unless it
  is the list's head it waits there, held (see the prelude).

  Input:
    KEYS[1] due zset        <ns>:{p}:due  (the default tenant's; see the
            prelude for the other tenants' and their index)
    KEYS[2] ready list      <ns>:{p}:ready
    KEYS[3] sequence        <ns>:{p}:seq
    ARGV[1] job key prefix  <ns>:{p}:job:  (same hash tag; records as the prelude lays them out)
    ARGV[2] wake channel
    ARGV[3] partition number
    ARGV[4] id of the first job; then, for every job, ten arguments:
    ARGV[5] its spec JSON (canonical; compared byte for byte on re-create)
    ARGV[6] its absolute due time in epoch ms, or "" for relative
    ARGV[7] its delay in ms (used when the due time is "")
    ARGV[8] its max attempts (rungs + 1)
    ARGV[9] its lease in ms, or "" for the daemon default
    ARGV[10] its given due time, as the record header keeps it (see the
            prelude; the spec JSON leaves run_at and delay out)
    ARGV[11] its ordering list `<topic>:<ordering key>`, or "" for none
            (the script takes its tenant's line, see order_line)
    ARGV[12] "c" to compare only: an absent id is NOT_FOUND, not created
            (the job belongs in another partition); "" to create
    ARGV[13] for an id of a schedule's fire id shape `<schedule id>:<13
            digits>`, that schedule's hash as it would be in this
            partition `<ns>:{p}:sched:<schedule id>` (same hash tag), else
            "": while the schedule lives here the id is its own, RESERVED
  Keys built here (same hash tag): the live record hashes `<ns>:{p}:jobs:*`
  and kept records `<ns>:{p}:job:<id>`, read, and for ids with neither the
  summary index and shards `<ns>:{p}:done*` (see the prelude); new records
  are written to the live hashes; ordering lists `<ns>:{p}:order:*`; the
  ledger `<ns>:{p}:ledger` counts the jobs created, per tenant.
  An existing live job's state is read from its partition's in-flight set
  and the round space (a round holding it is materialized: see "Round
  leases" in the prelude).
  Output:
    {now, code1, state1, due1, ahead1, code2, ...}, per job in order:
    code (of the prelude) DONE created, UNCHANGED an identical job exists,
    CHANGED the id exists with different content (nothing changed),
    SUMMARIZED the id belongs to a finished job's summary (nothing changed):
    then `due` is the summary's content digest, which the caller compares
    with the job's own (computed only in this rare case); ELSEWHERE the
    id's job lives in partition `due` (a pointer; nothing changed);
    NOT_FOUND (compare only) no such id here; RESERVED the id is the fire
    id of a schedule living here (nothing changed: only the schedule's
    firing creates it, so a hand-made job never takes a firing's place).
    `ahead` is, for a job created
    held, the id just ahead of it in its ordering list, else "".
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
local tails = {}       -- ordering list -> its last id, as this call leaves it
local ordered = false
for i = 4, #ARGV, 10 do
  local id, spec, order = ARGV[i], ARGV[i + 1], ARGV[i + 7]
  if order ~= '' then order = order_line(id, order) end
  local existing = nil
  local earlier = seen[id]
  if ARGV[i + 9] ~= '' and rcall('HEXISTS', ARGV[i + 9], 'spec') == 1 then
    existing = {RESERVED, '', 0}
  elseif earlier then
    existing = {earlier[1] == spec .. ARGV[i + 6], earlier[2], earlier[3]}
  else
    local v = rcall('HGET', live(prefix, id).h, id)
    local elsewhere = pointer_of(v)
    local live_r = not elsewhere and rec_of(v)
    local r = live_r or (not elsewhere and rec_get(kept(prefix, id)))
    if r then
      -- (A live job's lease says whether it is in flight; see the prelude.)
      local name = live_r and live_state_name(r, now, prefix .. 'inflight', id) or state_name(r, now)
      existing = {r.spec == spec and r.given == tonumber(ARGV[i + 6]), name, r.due}
    elseif elsewhere then
      existing = {ELSEWHERE, '', elsewhere}
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
      elseif ARGV[i + 8] == 'c' then
        existing = {NOT_FOUND, '', 0}
      end
    end
  end
  if existing then
    local code = CHANGED
    if existing[1] == 3 then
      code = SUMMARIZED
    elseif existing[1] == ELSEWHERE or existing[1] == NOT_FOUND or existing[1] == RESERVED then
      code = existing[1]
    elseif existing[1] then
      code = UNCHANGED
    end
    out[#out + 1] = code
    out[#out + 1] = existing[2]
    out[#out + 1] = existing[3]
    out[#out + 1] = ''
  else
    local due
    if ARGV[i + 2] ~= '' then due = tonumber(ARGV[i + 2]) else due = now + tonumber(ARGV[i + 3]) end
    local state = 'r'
    local ahead = ''
    if order ~= '' then
      ordered = true
      if tails[order] == nil then
        tails[order] = rcall('LINDEX', prefix .. 'order:' .. order, -1) or false
      end
      ahead = tails[order] or ''
      tails[order] = id
    end
    if ahead ~= '' then
      state = 'o'
    elseif due > now then
      state = 's'
      scheduled = scheduled + 1
    end
    local name = STATE_NAMES[state]
    if state == 'o' and due <= now then name = 'ready' end
    seen[id] = {spec .. ARGV[i + 6], name, due}
    created[#created + 1] = {i, state, due}
    out[#out + 1] = DONE
    out[#out + 1] = name
    out[#out + 1] = due
    out[#out + 1] = ahead
  end
end
-- Ordering lists are keys this script builds: not while the slot moves.
if ordered and IN_CLUSTER and slot_moving_once(KEYS[1]) then return try_again() end
if #created > 0 and not ledger_here(prefix) then return try_again() end

-- A tenant's ready list may be a key this script creates: likewise.
if IN_CLUSTER then
  local due_now = {}
  for _, c in ipairs(created) do
    if c[2] == 'r' then due_now[#due_now + 1] = ARGV[c[1]] end
  end
  if ready_push_blocked(KEYS[2], due_now) then return try_again() end
end

-- Pass 2: write. One INCRBY for the sequence numbers, one ZADD per due set,
-- one RPUSH per wheel bucket and one RPUSH per ready list.
-- (Every job created here had the slot checked in pass 1: the tenants'
-- due sets this may create are safe to write.)
local seq = 0
if scheduled > 0 then seq = rcall('INCRBY', KEYS[3], scheduled) - scheduled end
local wake_before = scheduled > 0 and next_wake(KEYS[1])
local wake = nil
local to_due, ready = due_batch(), {}
local to_wheel, in_wheel = wheel_batch(), 0
local lines, line_order, held = {}, {}, 0 -- ordering list -> ids joining it
local tally = ledger_tally()
for _, c in ipairs(created) do
  local i, state, due = c[1], c[2], c[3]
  local id, order = ARGV[i], ARGV[i + 7]
  if order ~= '' then order = order_line(id, order) end
  local r = {state = state, ut = now, att = 0, max = tonumber(ARGV[i + 4]), due = due,
    seq = 0, ct = now, lease = tonumber(ARGV[i + 5]) or 0, given = tonumber(ARGV[i + 6])}
  if order ~= '' then
    if not lines[order] then
      lines[order] = {}
      line_order[#line_order + 1] = order
    end
    lines[order][#lines[order] + 1] = id
  end
  if state == 'o' then
    held = held + 1
  elseif state == 'r' then
    ready[#ready + 1] = id
  else
    seq = seq + 1
    r.seq = seq
    local slot, opens = wheel_slot(due, now)
    if slot then
      r.state = 'w'
      in_wheel = in_wheel + 1
      wheel_batch_add(to_wheel, slot, opens, wheel_entry(prefix, id))
    else
      due_batch_add(to_due, KEYS[1], id, due, seq, prefix)
      if not wake or due < wake then wake = due end
    end
  end
  rec_create(live(prefix, id), r, ARGV[i + 1])
  ledger_count(tally, id)
end
ledger_add(prefix, 'created', tally)
for _, order in ipairs(line_order) do
  rcall('RPUSH', prefix .. 'order:' .. order, unpack(lines[order]))
end
if held > 0 then rcall('HINCRBY', prefix .. 'stats', 'held', held) end
local opens = wheel_batch_push(timers_prefix(KEYS[1]), to_wheel)
if opens and (not wake or opens < wake) then wake = opens end
wheel_count(prefix, in_wheel)
due_batch_push(KEYS[1], to_due)
if wake and (not wake_before or wake < wake_before) then wake_due(ARGV[2], ARGV[3], wake) end
if ready_push(KEYS[2], ready) then
  wake_ready(ARGV[2], ARGV[3])
end
return out
