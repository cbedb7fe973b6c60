--[[
  Claim up to N ready jobs for attempts: each gets a lease in the in-flight set,
  and its record is left as it is (the lease alone says it is in flight;
  see the prelude): its attempt is the record's counter plus one. The jobs
  claimed straight from the promotion share a round lease instead (one a
  lease length; see "Round leases" in the prelude). A job is
  ready when its record says so or, promoted by promote_due (which leaves
  the record alone), says `scheduled` with its due time passed. Ids whose
  job is no longer ready (cancelled while queued, expired, or in flight
  already), or whose record has no spec (a bare record left by hand; it is
  deleted), are dropped from the list without being claimed.

  With a promotion batch, due jobs are first promoted (promote_due_jobs in
  the prelude), so that the daemon that has the partition claims a job that
  just came due in one call. When no tenant has a ready list and the
  default one is empty, the default tenant's jobs just promoted are claimed
  straight from the promotion, without passing through the list (what the
  claim does not take is pushed).

  Tenants (SPEC §15): each tenant with ready jobs has a list of its own
  (see the prelude). With several, N is shared between them by weight (see
  share_lists in the prelude), and what a list cannot fill goes to the
  others. Inside a list, jobs keep their order. A claim looks at 64
  tenants' lists at most (a random pick of them when more have ready jobs),
  so its cost is bounded however many tenants there are. With only the
  default tenant's list (no tenant in the tenants set), a claim is one
  LRANGE as before tenants.

  Input:
    KEYS[1] ready list      <ns>:{p}:ready  (the default tenant's)
    KEYS[2] inflight zset   <ns>:{p}:inflight  (and the round space's
            `rounds` and `round` beside it: see the prelude)
    KEYS[3] due zset        <ns>:{p}:due  (the default tenant's; see the
            prelude for the other tenants' and their index)
    KEYS[4] wheel index     <ns>:{p}:wheel
    KEYS[5] tenants set     <ns>:{p}:tenants
    KEYS[6] turn            <ns>:{p}:turn  (the fair share's place in its cycle)
    ARGV[1] N, the most jobs to claim
    ARGV[2] job key prefix  <ns>:{p}:job:  (its partition's live record hashes
            `<ns>:{p}:jobs:*` are built from it)
    ARGV[3] default lease in ms
    ARGV[4] promotion batch: promote up to this many due jobs first (0: none)
    ARGV[5] claim ahead in ms (delivery.claim_ahead): jobs due within this
            much of now are promoted and claimed; the daemon holds each to
            its due time, and its lease runs from then
    ARGV[6] the weight of a tenant not named below
    ARGV[7] a tenant's name; then, for every tenant with a weight of its own,
            two arguments:
    ARGV[8] its weight
  Output:
    {now, more, moved, next_due, horizon, started_in, id1, attempt1, due1, record1,
    partition1, token1, id2, ...}:
    `token` is the job's lease's fencing token (its deadline, or its
    round's token), which its outcome names;
    `record` is the job's record as read (the header, then the spec JSON:
    the store takes the spec from it, so Redis copies no spec out of it);
    `partition` the partition the job lives in when the promotion took it
    from the shared timers of a single Redis (see the prelude), else -1
    (this one); `started_in` the partitions whose ready list the promotion
    started (a table, empty without a promotion: see promote_due);
    `more` is 1 when N ids were taken (the list may hold more), 0 when the
    list ran dry; `moved`, `next_due` and `horizon` as promote_due answers
    them, or -1 and -2 without a promotion.
    TRYAGAIN while the partition's slot is migrating: nothing was claimed
    (a promotion made before stands; it is a change of its own).
]]
local rcall = redis.call
local now = now_ms()

local want = arg_number(ARGV[1])
-- Jobs due by the horizon are claimed (held by the daemon to their time).
local horizon = now + arg_number(ARGV[5])

local out = {now, 0, -1, -2, horizon, EMPTY}
local promote = arg_number(ARGV[4])
-- One EXISTS tells whether the tenants set or the default list exists
-- (neither, a steady load's usual case, means no list to claim from), and
-- whether the tenants' due index and the wheel's index do (the promotion
-- skips reading an absent one). EXISTS counts a key once per time it is
-- named: the two lists count at most 2, so the index is named 3 times
-- and the wheel 6 (more than the others' 5 together): the count modulo 3
-- is the lists', modulo 6 the lists' and the index's.
local INDEX_WEIGHT, WHEEL_WEIGHT = 3, 6
local index, wheel = due_index(KEYS[3]), KEYS[4]
local present = rcall('EXISTS', KEYS[5], KEYS[1], index, index, index,
  wheel, wheel, wheel, wheel, wheel, wheel)
local lists_empty = present % INDEX_WEIGHT == 0
local index_absent = present % WHEEL_WEIGHT < INDEX_WEIGHT
local wheel_absent = present < WHEEL_WEIGHT
local tenants = 0
if not lists_empty then tenants = rcall('SCARD', KEYS[5]) end
-- Promoted jobs the promotion handed back: with no tenant's list and the
-- default list empty, the default tenant's jobs just promoted are claimed
-- without passing through the list (its order is theirs).
local kept, kept_parts, started = nil, nil, false
if promote > 0 then
  local keep = 0
  if want > 0 and (lists_empty or (tenants == 0 and rcall('LLEN', KEYS[1]) == 0)) then keep = want end
  local moved, next_due
  local started_in
  moved, next_due, started, kept, started_in, kept_parts = promote_due_jobs(KEYS[3], KEYS[1],
    KEYS[4], promote, now, horizon, keep, index_absent, wheel_absent)
  if not moved then return try_again() end
  out[6] = started_in
  -- A tenant's list it started joined the tenants set.
  if started then tenants = rcall('SCARD', KEYS[5]) end
  out[3], out[4] = moved, next_due
  if #kept == 0 then kept = nil end
end
-- (LRANGE 0 -1 would be the whole list.)
if want < 1 then return out end
-- Every list was empty and none started: nothing to claim.
if lists_empty and not started and not kept then return out end
local prefix = partition_prefix(ARGV[2], 'job:')
-- The ids to claim, and the lists they come from (none for the jobs kept
-- from the promotion: taken already, no list to trim).
local lists, ids = EMPTY, kept
if not kept then
  if tenants == 0 then
    lists = {{key = KEYS[1], ids = rcall('LRANGE', KEYS[1], '0', int_text(want - 1))}}
  else
    -- At most TENANTS_PER_CLAIM of them, a random pick when there are more.
    lists = share_lists(ARGV, KEYS[1], KEYS[6], rcall('SRANDMEMBER', KEYS[5], TENANTS_PER_CLAIM), want)
    if not lists then return try_again() end
  end
  ids = lists[1] and lists[1].ids or EMPTY
  if #lists > 1 then
    ids = {}
    for _, l in ipairs(lists) do
      for _, id in ipairs(l.ids) do ids[#ids + 1] = id end
    end
  end
  if #ids == 0 and #lists == 1 then return out end
end
-- (Tenants left out of this claim's pick may have jobs: look again.)
if #ids == want or tenants > TENANTS_PER_CLAIM then out[2] = 1 end

-- Read pass: every job record before the first write (see the prelude).
-- Jobs kept from the shared timers of a single Redis (see the prelude)
-- live in their own partitions, named by their due members' tags
-- (`parts`; `ns` is the namespace's prefix).
-- (Per job: its record `records[i]` and hash `hashes[i]`; per partition
-- number, its prefix, record hashes' names and due tag, looked up once a
-- call: the loops below are the steady load's hottest, and a Lua call a
-- job costs more than these lookups.)
local records, hashes = {}, {}
local parts, ns = nil, nil
if kept and not IN_CLUSTER then parts, ns = kept_parts, namespace_prefix(prefix) end
local part_prefix, part_names, part_tag = {}, {}, {}
for i = 1, #ids do
  local id, q = ids[i], parts and parts[i] or -1
  local names = part_names[q]
  if not names then
    part_prefix[q] = q >= 0 and prefix_of_partition(ns, q) or prefix
    names = job_hash_names(part_prefix[q])
    part_names[q], part_tag[q] = names, parts and due_tag(part_prefix[q]) or ''
  end
  local shard = job_shard(id)
  local h = names[shard] or job_hash_of_shard(part_prefix[q], shard)
  local v = rcall('HGET', h, id)
  if not v and slot_moving_once(KEYS[1]) then return try_again() end
  records[i], hashes[i] = v or false, h
end
-- A job with a lease is in flight already (its id came to a list twice).
-- (Not the jobs kept from the promotion: no job with a lease is in a due
-- set, as every step that puts one there ends its lease or refuses a job
-- in flight.)
local leased, rounded = EMPTY, nil
if not kept and #ids > 0 then
  leased = rcall('ZMSCORE', KEYS[2], unpack(ids))
  -- (Or in a live round: see the prelude.)
  rounded = round_index(round_space(prefix))
end
for _, l in ipairs(lists) do
  if #l.ids > 0 then rcall('LTRIM', l.key, #l.ids, -1) end
  -- A tenant whose list ran dry leaves the set (a push brings it back).
  if l.tenant and l.dry then rcall('SREM', KEYS[5], l.tenant) end
end

-- (An id can repeat only among several.) The jobs kept from the
-- promotion share a round lease a lease length (see the prelude), in
-- `rounds` by lease (`round_order` in the order first seen); the others
-- get leases of their own in their partition's in-flight set (`leases`).
local leases, taken = {}, #ids > 1 and {}
local rounds, round_order = nil, nil
if kept then rounds, round_order = {}, {} end
-- (Counts kept by hand: `#t` searches the table on each use.)
local n_out, n_leases = #out, 0
local default_lease = arg_number(ARGV[3])
for i = 1, #ids do
  local id, v = ids[i], records[i]
  local state, att, due, lease
  -- (REC_CLAIM_FMT's fields, and ready_by written out.)
  if v and #v >= REC_HEADER then state, att, due, lease = struct.unpack(REC_CLAIM_FMT, v) end
  if v and not state then
    -- A bare record (its job was deleted by hand): nothing to deliver.
    rec_delete_in(hashes[i], id)
  elseif state and (state == 'r' or (state == 's' and due <= horizon)) and not leased[i]
      and not (taken and taken[id])
      and not (rounded and rounded[wheel_entry(prefix, id)]) then
    if taken then taken[id] = true end
    local attempt = att + 1
    if lease == 0 then lease = default_lease end
    -- (A job claimed ahead is attempted at its due time.)
    local ends, partition, token = (due > now and due or now) + lease, -1, nil
    if parts then partition = parts[i] end
    if rounds then
      -- Its round's entries: ' ', tag, id, ' ', tag, id, ... (the tag ''
      -- in a cluster); its token is written once the round is whole.
      local round = rounds[lease]
      if not round then
        round = {ends = ends, entries = {' '}, n = 1, at = {}, jobs = 0}
        rounds[lease] = round
        round_order[#round_order + 1] = lease
      elseif ends > round.ends then
        round.ends = ends
      end
      local entries, n = round.entries, round.n
      entries[n + 1] = part_tag[parts and partition or -1]
      entries[n + 2] = id
      entries[n + 3] = ' '
      round.n, round.jobs = n + 3, round.jobs + 1
      round.at[round.jobs] = n_out + 6
      token = false
    else
      token = string.format('%d', ends)
      leases[n_leases + 1], leases[n_leases + 2] = token, id
      n_leases = n_leases + 2
    end
    out[n_out + 1], out[n_out + 2], out[n_out + 3] = id, attempt, due
    out[n_out + 4], out[n_out + 5], out[n_out + 6] = v, partition, token
    n_out = n_out + 6
  end
end
if n_leases > 0 then rcall('ZADD', KEYS[2], unpack(leases)) end
if round_order then
  local space = round_space(prefix)
  for _, lease in ipairs(round_order) do
    local round = rounds[lease]
    local entries = round.entries
    local deadline = string.format('%d', round.ends)
    local token = deadline .. '/' .. rcall('HINCRBY', space .. 'round', 'next', 1)
    rcall('ZADD', space .. 'rounds', deadline, token)
    rcall('HSET', space .. 'round', token, table.concat(entries), token .. '#', int_text(round.jobs))
    local at = round.at
    for j = 1, round.jobs do out[at[j]] = token end
  end
end
return out
