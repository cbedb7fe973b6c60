--[[
  Fire due schedules of one partition: for each, the jobs of the fire
  times the daemon computed (src/schedule.rs) are created and the schedule
  advances to its next fire time, in this one step, provided the schedule
  still waits for the fire time and is still the version the daemon read:
  of two daemons firing the same schedule at once one wins, the other
  changes nothing, so no fire time is skipped or doubled, without a lock.

  The job of fire time T has id `<schedule id>:<T>`, lives in the
  schedule's partition, is due at T (its record's given due time is T)
  and stores the schedule's template as its spec; with an ordering key it
  joins the tail of its ordering list (held unless the list is empty, see
  the prelude). With `overlap = "skip"`
  a fire time whose previous job still has a live record (not delivered,
  dead or cancelled) creates nothing and is recorded as skipped.

  Input:
    KEYS[1] fire index      <ns>:{p}:fires
    KEYS[2] due zset        <ns>:{p}:due  (the default tenant's; see the
            prelude for the other tenants' and their index)
    KEYS[3] ready list      <ns>:{p}:ready
    KEYS[4] sequence        <ns>:{p}:seq
    ARGV[1] key prefix      <ns>:{p}:  (schedule hashes, job records and
            the ledger `<ns>:{p}:ledger`, counting fired jobs per tenant,
            are built from it)
    ARGV[2] wake channel
    ARGV[3] partition number
    ARGV[4] id of the first schedule; then, for every schedule, six arguments:
    ARGV[5] the fire time it was read waiting for (its score)
    ARGV[6] the version read
    ARGV[7] fire times to create jobs for, oldest first, joined by ","
    ARGV[8] fire times passed over (missed, not caught up), joined by ","
    ARGV[9] its next fire time, or "" (it has ended)
  Output:
    {now, head, n1, t, o, t, o, ..., n2, ...}: head is the earliest fire
    time left in the fire index after this call (-1: none); then per
    schedule in order, the number n of fire times recorded (0: it was
    stale, nothing changed), then each time t with its outcome o (1 fired,
    0 skipped).
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local rcall = redis.call
local now = now_ms()
local prefix = ARGV[1]

local function split(text)
  local out = {}
  for t in string.gmatch(text, '[^,]+') do out[#out + 1] = tonumber(t) end
  return out
end

-- Read pass: each schedule, and whether it is still what the daemon read.
local plans = {}
for i = 4, #ARGV, 6 do
  local id = ARGV[i]
  local key = prefix .. 'sched:' .. id
  local f = rcall('HMGET', key, 'meta', 'tmpl', 'prev', 'last')
  local m = schedule_meta(f[1])
  local score = rcall('ZSCORE', KEYS[1], id)
  local current = m and tostring(m.ver) == ARGV[i + 2] and score
    and tonumber(score) == tonumber(ARGV[i + 1])
  if not f[1] and slot_moving_once(KEYS[1]) then return try_again() end
  plans[#plans + 1] = {id = id, key = key, f = f, m = m, current = current,
    fire = split(ARGV[i + 3]), skip = split(ARGV[i + 4]), next = ARGV[i + 5]}
end
if IN_CLUSTER and #plans > 0 and slot_moving(KEYS[1]) then return try_again() end
if #plans > 0 and not ledger_here(prefix) then return try_again() end

local out = {now}
local ready, zadd, seqs, held = {}, {}, 0, 0
local tally = ledger_tally()
for _, plan in ipairs(plans) do
  if not plan.current then
    out[#out + 1] = 0
  else
    local f, m = plan.f, plan.m
    local skip_overlap = m.overlap == 'skip'
    local prev = f[3]
    local runs = {}
    for _, t in ipairs(plan.skip) do runs[#runs + 1] = {t, 0} end
    for _, t in ipairs(plan.fire) do
      local busy = skip_overlap and prev and prev ~= '' and rec_exists(live(prefix, prev))
      if busy then
        runs[#runs + 1] = {t, 0}
      else
        local job = plan.id .. ':' .. string.format('%d', t)
        local at = live(prefix, job)
        if not rec_exists(at) then
          ledger_count(tally, job)
          local r = {state = 'r', ut = now, att = 0, max = m.max, due = t, seq = 0,
            ct = now, lease = m.lease, given = t}
          local line = m.order ~= '' and prefix .. 'order:' .. order_line(job, m.order)
          local behind = line and rcall('LLEN', line) > 0
          if line then rcall('RPUSH', line, job) end
          if behind then
            r.state = 'o'
            rec_create(at, r, f[2])
            held = held + 1
          elseif t <= now then
            rec_create(at, r, f[2])
            ready[#ready + 1] = job
          else
            seqs = seqs + 1
            -- (its spec kept on the record: rec_put rewrites it below
            -- with its sequence number)
            r.state, r.seq, r.spec = 's', seqs, f[2]
            rec_create(at, r, f[2])
            zadd[#zadd + 1] = {t, job, r}
          end
        end
        prev = job
        runs[#runs + 1] = {t, 1}
      end
    end
    -- The last runs, newest first, at most 10.
    local last = {}
    for k = #runs, 1, -1 do
      if #last == 10 then break end
      last[#last + 1] = string.format('%d', runs[k][1]) .. (runs[k][2] == 1 and 'f' or 's')
    end
    for old in string.gmatch(f[4] or '', '[^,]+') do
      if #last == 10 then break end
      last[#last + 1] = old
    end
    rcall('HSET', plan.key, 'last', table.concat(last, ','), 'prev', prev or '', 'next', plan.next)
    if plan.next == '' then
      rcall('ZREM', KEYS[1], plan.id)
    else
      rcall('ZADD', KEYS[1], plan.next, plan.id)
    end
    out[#out + 1] = #runs
    for _, run in ipairs(runs) do
      out[#out + 1] = run[1]
      out[#out + 1] = run[2]
    end
  end
end
if held > 0 then rcall('HINCRBY', prefix .. 'stats', 'held', held) end
ledger_add(prefix, 'created', tally)
-- Jobs due in the future (a fire time the daemon saw due by a clock
-- running ahead of this one) wait in the due set like any job.
if #zadd > 0 then
  local base = rcall('INCRBY', KEYS[4], seqs) - seqs
  local to_due = due_batch()
  for _, z in ipairs(zadd) do
    z[3].seq = base + z[3].seq
    rec_put(live(prefix, z[2]), z[3])
    due_batch_add(to_due, KEYS[2], z[2], z[1], z[3].seq, prefix)
  end
  due_batch_push(KEYS[2], to_due)
  wake_due(ARGV[2], ARGV[3], zadd[1][1])
end
if ready_push(KEYS[3], ready) then
  wake_ready(ARGV[2], ARGV[3])
end
-- The index's head, so that the daemon knows when to fire next without
-- another round trip.
local head = rcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
table.insert(out, 2, tonumber(head[2]) or -1)
return out
