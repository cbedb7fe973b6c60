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
  kept). A job claimed in a round (see the prelude) names its round's
  token instead: it is current while its round lives (one ZMSCORE of the
  call's rounds), or, once the round was materialized, while its own
  lease holds the deadline the token names; its outcome ends its part of
  the round, and the round ends with its last job. An outcome sent again
  (the daemon's retry after a call whose answer was lost) marks its token
  with a leading `!`: its job is current only while its record is live
  (a round's count must not be ended twice).

  Several partitions in one call (a single Redis): a unit of six
  arguments whose id is "" starts the next partition's jobs (its job and
  history key prefixes and its number; its in-flight set and stats hash
  are built from the job prefix, as the claim builds its leases' sets). At
  a steady load a window's outcomes of every partition then cost one call
  instead of one per partition, and the DEL of their histories and the
  ledger's HINCRBY are made once (docs/performance.md). A partition's
  fencing, record, summaries and stats stay its own; the ledger, summed
  over the partitions by its readers, counts the whole call in the first
  partition's. In a cluster a call holds one partition (its keys on one
  slot).

  Input:
    KEYS[1] inflight zset   <ns>:{p}:inflight  (the first partition's)
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
    ARGV[8] its lease's fencing token, as its claim answered it: the
            deadline (ms) or its round's token; after `!` when sent again
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
            A unit starting the next partition (single Redis) is "", its
            job key prefix, its history key prefix, its number, "", "".
  Output:
    {r1, r2, ...} one per job (the units that start a partition have
    none), in order: DONE recorded, UNCHANGED stale (the lease was taken
    over or the job was cancelled; nothing changed for that job). (The
    codes of the prelude.)
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local rcall = redis.call
local now = now_ms()
local retention = tonumber(ARGV[3])
local keep = ARGV[4] == 'keep'

-- The call's partitions, each with its prefixes, keys and jobs: `ids`,
-- whose arguments start at ARGV index `from`, six a job.
local parts = {}
local part = {prefix = partition_prefix(ARGV[1], 'job:'), hist = ARGV[2], p = ARGV[6],
  inflight = KEYS[1], stats = KEYS[2], ids = {}, from = 7}
parts[1] = part
for i = 7, #ARGV, 6 do
  if ARGV[i] ~= '' then
    part.ids[#part.ids + 1] = ARGV[i]
  elseif IN_CLUSTER then
    return redis.error_reply('ERR complete_jobs: one partition a call in a cluster')
  else
    local prefix = partition_prefix(ARGV[i + 1], 'job:')
    part = {prefix = prefix, hist = ARGV[i + 2], p = ARGV[i + 3], inflight = prefix .. 'inflight',
      stats = prefix .. 'stats', ids = {}, from = i + 6}
    parts[#parts + 1] = part
  end
end
-- A summary's finish time, the same for every job of the call.
local finished = struct.pack('>I6', now)

-- Read pass: every key to be written, before the first write (see the
-- prelude). A history list may rightly be absent (a first attempt).
-- Per job, by its place k in the call (counted over the partitions in
-- order, so the tables stay arrays): its record hash, whether it is
-- current (false when stale; with keep, its whole record), its summary's
-- field values, and the plan of leaving its ordering list (only for a job
-- that has one). Per partition: its recorded jobs (`done`), their ids'
-- hashes (summary) and summaries' field count, and its summaries' plan.
local hashes, current, pieces, lines = {}, {}, {}, {}
-- The call's rounds (see the prelude): by token, whether it lives (read
-- in one ZMSCORE), and how many of its jobs this call ends (`ending`).
-- Per partition, each job's token (`tokens`, without a leading `!`,
-- which `again` notes).
local space = round_space(parts[1].prefix)
local round_lives, round_tokens, ending = {}, {}, {}
for _, q in ipairs(parts) do
  local tokens, again = {}, {}
  for j = 1, #q.ids do
    local token = ARGV[q.from + 6 * (j - 1) + 1]
    if string.byte(token) == 33 then -- '!'
      token = string.sub(token, 2)
      again[j] = true
    end
    tokens[j] = token
    -- (A deadline alone is 13 digits: only a longer token may be a round's.)
    if #token > 13 and round_lives[token] == nil and round_deadline(token) then
      round_lives[token] = false
      round_tokens[#round_tokens + 1] = token
    end
  end
  q.tokens, q.again = tokens, again
end
if #round_tokens > 0 then
  local scores = rcall('ZMSCORE', space .. 'rounds', unpack(round_tokens))
  for i, token in ipairs(round_tokens) do round_lives[token] = scores[i] ~= false end
end
local k = 0
for _, q in ipairs(parts) do
  local prefix, ids, tokens, again = q.prefix, q.ids, q.tokens, q.again
  -- Leases of the jobs' own: of the jobs not in a live round.
  -- (Counts kept by hand here and below: `#t` searches the table on
  -- each use.)
  local own, n_own = {}, 0
  for j = 1, #ids do
    if not round_lives[tokens[j]] then
      n_own = n_own + 1
      own[n_own] = ids[j]
    end
  end
  local leases = n_own > 0 and rcall('ZMSCORE', q.inflight, unpack(own)) or EMPTY
  local lease_of = {}
  for n = 1, n_own do lease_of[own[n]] = leases[n] end
  q.own = {}
  local done, done_hashes, fields, n_done = {}, {}, 0, 0
  -- (job_hash written out, and the usual summary's pieces and count below:
  -- this loop and the next are a steady load's hottest, and a Lua call a
  -- job costs more than the lookups.)
  local names = job_hash_names(prefix)
  for j = 1, #ids do
    local id, i = ids[j], q.from + 6 * (j - 1)
    k = k + 1
    local shard = job_shard(id)
    local h = names[shard] or job_hash_of_shard(prefix, shard)
    hashes[k] = h
    -- (Scores read as Redis formats them; a number compared only when the
    -- texts differ.)
    local token, r = tokens[j], nil
    if round_lives[token] then
      r = true
    else
      local lease = lease_of[id]
      r = lease and (lease == token
        or tonumber(lease) == (round_lives[token] == false and round_deadline(token) or tonumber(token)))
      if r then q.own[#q.own + 1] = id end
    end
    if r and (keep or again[j]) then
      r = rec_of(rcall('HGET', h, id)) or false
      if r and not keep then r = true end
    end
    if r and round_lives[token] then ending[token] = (ending[token] or 0) + 1 end
    -- (A current job's record is here, unless its key has not arrived.)
    if IN_CLUSTER and r and (rcall('EXISTS', h) == 0 or rcall('EXISTS', q.hist .. id) == 0)
        and slot_moving_once(q.inflight) then
      return try_again()
    end
    current[k], pieces[k] = r, false
    if r then
      n_done = n_done + 1
      done[n_done] = id
      if not keep then
        done_hashes[n_done] = struct.unpack('>I4', ARGV[i + 5])
        local earlier = EMPTY
        if struct.unpack('>I2', ARGV[i + 2]) > 1 then
          earlier = summary_entries(rcall('LRANGE', q.hist .. id, 0, -1), 1, now)
        end
        local value = 'd' .. ARGV[i + 2] .. finished .. ARGV[i + 3]
        if #value <= SUMMARY_MAX and earlier == EMPTY then
          pieces[k], fields = value, fields + 1
        else
          pieces[k] = summary_pieces(value, earlier, false)
          fields = fields + summary_field_count(pieces[k])
        end
      end
      if ARGV[i + 4] ~= '' then
        lines[k] = order_plan(prefix, order_line(id, ARGV[i + 4]))
        if not lines[k] then return try_again() end
      end
    end
  end
  q.done = done
  if #done > 0 and not ledger_here(prefix) then return try_again() end
  if not keep and #done > 0 then
    q.plan = summaries_plan(prefix, done, now, retention, fields, done_hashes)
    if not q.plan then return try_again() end
  end
end

local out, gone, n_gone = {}, {}, 0
local tally = ledger_tally()
k = 0
for _, q in ipairs(parts) do
  local prefix, ids, summaries, n_summaries = q.prefix, q.ids, {}, 0
  for j = 1, #ids do
    local id, i = ids[j], q.from + 6 * (j - 1)
    k = k + 1
    local r = current[k]
    if r and keep then
      local hist = q.hist .. id
      -- (Current: its lease was held, so its attempt is in flight.)
      r.state, r.att, r.ut = 'd', rec_flight_attempt(r), now
      rec_keep(prefix, id, r, retention)
      history_push(hist, ARGV[i + 3])
      rcall('PEXPIRE', hist, retention)
    elseif r then
      rcall('HDEL', hashes[k], id)
      n_gone, n_summaries = n_gone + 1, n_summaries + 1
      gone[n_gone], summaries[n_summaries] = q.hist .. id, pieces[k]
    end
    if lines[k] then order_leave(prefix, lines[k], id, now, ARGV[5], q.p) end
    out[k] = r and DONE or UNCHANGED
  end
  local done = q.done
  if #done > 0 then
    if n_summaries > 0 then summaries_write(prefix, q.plan, done, summaries, now) end
    if #q.own > 0 then rcall('ZREM', q.inflight, unpack(q.own)) end
    rcall('HINCRBY', q.stats, 'delivered', int_text(#done))
    ledger_count_all(tally, done)
  end
end
-- (Histories of every partition at once: the keys of a single Redis, or
-- of the one partition of a cluster's call.)
if n_gone > 0 then rcall('DEL', unpack(gone)) end
-- The rounds' jobs ended here; a round ends with its last.
for token, n in pairs(ending) do
  if rcall('HINCRBY', space .. 'round', token .. '#', -n) <= 0 then
    rcall('HDEL', space .. 'round', token, token .. '#')
    rcall('ZREM', space .. 'rounds', token)
  end
end
-- (A tally of no job adds nothing.)
ledger_add(parts[1].prefix, 'delivered', tally)
return out
