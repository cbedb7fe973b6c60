--[[
  Record successful attempts of one partition in one call: each job whose
  lease is still current becomes delivered and leaves the in-flight set.
  By default its record and history are deleted and a summary remains (see
  the prelude); with `retention.keep_bodies` the record moves, marked
  delivered, to its kept key, and it and its history expire after the
  retention period.
  Batching is what lets a busy daemon record thousands of deliveries a
  second without one script call (and one TIME, ZREM, HINCRBY) per job.
  A job with an ordering key leaves its ordering list, releasing the job
  behind it (see the prelude). A summary keeps the earlier attempts of a
  job that needed more than one, read from its history list (one LRANGE,
  only for such a job: a first attempt has no history, so the delivery
  path pays nothing more; a job replayed from the dead letters and
  delivered on its first attempt since keeps that attempt alone).

  Fencing: a job's outcome is current while the in-flight set holds its
  lease with the deadline the claim gave it (the daemon sends it back as
  the attempt's token). A lease taken back, cancelled, given back or
  recorded is gone, and a later claim's lease ends later than this one
  (it comes after this one was taken back, at its deadline or later), so
  one ZMSCORE for the call fences every job, and a summary takes the
  attempt's counters from the daemon (the claim read them): the record is
  not read, only deleted (with `retention.keep_bodies`, it is read to be
  kept).

  Input:
    KEYS[1] inflight zset   <ns>:{p}:inflight
    KEYS[2] stats hash      <ns>:{p}:stats
    ARGV[1] job key prefix      <ns>:{p}:job:   (same hash tag; the live record
            hashes, kept records, summaries and the ledger `<ns>:{p}:ledger`,
            counting the jobs delivered per tenant, are built from it)
    ARGV[2] history key prefix  <ns>:{p}:hist:  (same hash tag)
    ARGV[3] retention in ms
    ARGV[4] "keep" to keep records (keep_bodies), "summary" to summarise
    ARGV[5] wake channel
    ARGV[6] partition number
    ARGV[7] id of the first job; then, for every job, six arguments:
    ARGV[8] its lease's deadline (ms, as its claim set it: the fencing token)
    ARGV[9] summary: the summary head's counters, as its claim left them:
            the attempt number, the attempts allowed (2 bytes each) and the
            creation time (6 bytes), big-endian; keep: ""
    ARGV[10] keep: its attempt record JSON; summary: its summary's tail
    ARGV[11] its ordering list `<topic>:<ordering key>`, or "" for none
            (the script takes its tenant's line, see order_line)
    ARGV[12] summary: its id's hash (id_hash of the prelude, which the
            store computes the same to read summaries; 4 bytes,
            big-endian): sent, as it costs the daemon less than Lua
            (~4,900 instructions a job); keep: ""
  Output:
    {r1, r2, ...} one per job, in order: DONE recorded, UNCHANGED stale (the
    lease was taken over or the job was cancelled; nothing changed for that
    job). (The codes of the prelude.)
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local rcall = redis.call
local now = now_ms()
local retention = tonumber(ARGV[3])
local keep = ARGV[4] == 'keep'

-- Read pass: every key to be written, before the first write (see the
-- prelude). A history list may rightly be absent (a first attempt).
local prefix = partition_prefix(ARGV[1], 'job:')
local ids = {}
for i = 7, #ARGV, 6 do ids[#ids + 1] = ARGV[i] end
if #ids == 0 then return {} end
local leases = rcall('ZMSCORE', KEYS[1], unpack(ids))
-- A summary's finish time, the same for every job of the call.
local finished = struct.pack('>I6', now)
-- Per job, by its place j in the call (ARGV index 6j + 1; sequential,
-- so the tables stay arrays): its record hash, whether it is current
-- (false when stale; with keep, its whole record), its summary's field
-- values, and the plan of leaving its ordering list (only for a job that
-- has one).
local hashes, current, pieces = {}, {}, {}
-- The recorded jobs, and (summary) their ids' hashes.
local done, done_hashes = {}, {}
local fields = 0
local lines = {}
for j, id in ipairs(ids) do
  local i = 6 * j + 1
  local h = job_hash(prefix, id)
  hashes[j] = h
  -- (Scores read as Redis formats them; a number compared only when the
  -- texts differ.)
  local lease, token = leases[j], ARGV[i + 1]
  local r = lease and (lease == token or tonumber(lease) == tonumber(token))
  if r and keep then r = rec_of(rcall('HGET', h, id)) or false end
  -- (A current job's record is here, unless its key has not arrived.)
  if IN_CLUSTER and r and (rcall('EXISTS', h) == 0 or rcall('EXISTS', ARGV[2] .. id) == 0)
      and slot_moving_once(KEYS[1]) then
    return try_again()
  end
  current[j], pieces[j] = r, false
  if r then
    done[#done + 1] = id
    if not keep then
      done_hashes[#done] = struct.unpack('>I4', ARGV[i + 5])
      local earlier = EMPTY
      if struct.unpack('>I2', ARGV[i + 2]) > 1 then
        earlier = summary_entries(rcall('LRANGE', ARGV[2] .. id, 0, -1), 1, now)
      end
      pieces[j] = summary_pieces('d' .. ARGV[i + 2] .. finished .. ARGV[i + 3], earlier, false)
      fields = fields + summary_field_count(pieces[j])
    end
    if ARGV[i + 4] ~= '' then
      lines[j] = order_plan(prefix, order_line(id, ARGV[i + 4]))
      if not lines[j] then return try_again() end
    end
  end
end
if #done > 0 and not ledger_here(prefix) then return try_again() end
local plan = nil
if not keep and #done > 0 then
  plan = summaries_plan(prefix, done, now, retention, fields, done_hashes)
  if not plan then return try_again() end
end

local out = {}
local gone, summaries = {}, {}
for j, id in ipairs(ids) do
  local i = 6 * j + 1
  local r = current[j]
  if r and keep then
    local hist = ARGV[2] .. id
    -- (Current: its lease was held, so its attempt is in flight.)
    r.state, r.att, r.ut = 'd', rec_flight_attempt(r), now
    rec_keep(prefix, id, r, retention)
    history_push(hist, ARGV[i + 3])
    rcall('PEXPIRE', hist, retention)
  elseif r then
    rec_delete_in(hashes[j], id)
    gone[#gone + 1] = ARGV[2] .. id
    summaries[#summaries + 1] = pieces[j]
  end
  if lines[j] then order_leave(prefix, lines[j], id, now, ARGV[5], ARGV[6]) end
  out[j] = r and DONE or UNCHANGED
end
if #done > 0 then
  if #gone > 0 then
    rcall('DEL', unpack(gone))
    summaries_write(prefix, plan, done, summaries, now)
  end
  rcall('ZREM', KEYS[1], unpack(done))
  rcall('HINCRBY', KEYS[2], 'delivered', int_text(#done))
  local tally = ledger_tally()
  for _, id in ipairs(done) do ledger_count(tally, id) end
  ledger_add(prefix, 'delivered', tally)
end
return out
