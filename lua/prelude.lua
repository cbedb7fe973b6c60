--[[
  Prepended to every script of this directory (it is not a script itself).

  During a Redis Cluster slot migration a partition's keys leave the source
  node one batch at a time. Redis checks a script's declared KEYS up front
  (TRYAGAIN or ASK when some have moved), but the per-job keys a script
  builds from an id are checked only when touched: on the source node a key
  that has left fails the script at that command, after its earlier writes;
  on the target node a key that has not arrived yet reads as absent.

  So every script reads each per-job key it will write before its first
  write, and when one is absent it asks `slot_moving`: if the partition's
  slot is migrating or importing on this node, the script answers TRYAGAIN
  having changed nothing, and the caller retries after the migration.

  `IN_CLUSTER` (defined above this prelude when the store compiles the
  scripts) is false on a single Redis, where no slot moves: reads made only
  for this guard are skipped there.
]]

-- The outcome codes of the scripts that change one job (or one host), the
-- same in every script and in the store (`scripts::Code`):
local DONE = 1          -- the change was made
local DEAD_LETTERED = 2 -- (fail_job) the job's last attempt failed: it is dead
local UNCHANGED = 0     -- nothing to do: already so, identical, or stale
local NOT_FOUND = -1    -- no such job (or dead letter)
local WRONG_STATE = -2  -- the job's state does not allow it
local CHANGED = -3      -- the job differs from what the caller expected
local SUMMARIZED = -4   -- only a finished job's summary remains
local ELSEWHERE = -5    -- the id's job lives in another partition (a pointer)
local RESERVED = -6     -- (enqueue_jobs) the id is a schedule's fire id
local IN_FLIGHT = 3     -- (cancel_job) done, but a worker had the job already

-- An empty list the hot paths share instead of making one each time: read
-- only, never written to.
local EMPTY = {}

-- Whether the cluster slot of `key` is migrating from or importing to this
-- node right now; always false outside a cluster.
local function slot_moving(key)
  if not IN_CLUSTER then return false end
  local nodes = redis.pcall('CLUSTER', 'NODES')
  if type(nodes) ~= 'string' then return false end
  local me = string.match(nodes, '[^\n]*myself[^\n]*')
  if not me then return false end
  local slot = redis.call('CLUSTER', 'KEYSLOT', key)
  return string.find(me, '[' .. slot .. '-', 1, true) ~= nil
end

-- The answer of a script that gave up, unchanged, because its slot is moving.
local function try_again()
  return redis.error_reply('TRYAGAIN hookq: the partition\'s slot is being migrated; nothing changed')
end

local moving_checked = false
-- Called when a key the script needs is absent: whether that is because the
-- slot of `key` is moving (then the script must give up). Asked once per
-- call: the answer cannot change while a script runs.
local function slot_moving_once(key)
  if moving_checked then return false end
  moving_checked = true
  return slot_moving(key)
end

-- Redis's clock, epoch ms: the one clock of every due time and lease.
-- Redis's time for the calls of a batch (lua/batch.lua), which run at one
-- moment and so read TIME once; nil outside a batch.
local batch_now = nil

-- Small integers as the scripts' arguments carry them and as commands take
-- them: tonumber parses with strtod and string.format('%d') formats with
-- vfprintf, each costing Redis more than a table lookup, and a batch's
-- counts, attempt numbers and settings are mostly small.
local SMALL_NUMBERS, SMALL_TEXTS = {}, {}
for i = 0, 1024 do SMALL_NUMBERS['' .. i], SMALL_TEXTS[i] = i, '' .. i end

-- tonumber(s), for an argument that is mostly a small integer.
local function arg_number(s)
  return SMALL_NUMBERS[s] or tonumber(s)
end

-- string.format('%d', n), for an integer `n` that is mostly small.
local function int_text(n)
  return SMALL_TEXTS[n] or string.format('%d', n)
end

local function now_ms()
  if batch_now then return batch_now end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

--[[
  Job records. A job's record is one value: a fixed 33-byte header, then its
  spec JSON. A live job's record (scheduled, ready, in flight) is a field of
  one of the partition's 64 record hashes, `<ns>:{p}:jobs:<shard>`, chosen
  by the id's last characters: a hash field costs ~32 bytes less than a key
  of its own (no object header, no key prefix). A finished job kept whole
  (dead, or `retention.keep_bodies`) moves to a STRING `<ns>:{p}:job:<id>`
  that expires after the retention period; by default a delivered or
  cancelled job keeps only a summary (below). Header, big-endian:

    offset  0  state      1 byte   s scheduled (in the due set), w
                                   scheduled (in the timing wheel, below),
                                   p parked (scheduled, held for its host),
                                   o held behind earlier jobs of its
                                   ordering key (see the end),
                                   r ready, i in flight, d delivered,
                                   x dead, c cancelled
    offset  1  updated    6 bytes  ms
    offset  7  attempts   2 bytes  made before the one in flight (a claim
                                   leaves them: its attempt, + 1, is a
                                   failure's fencing token; see In flight)
    offset  9  max        2 bytes  attempts allowed
    offset 11  due        6 bytes  ms, of the pending or last attempt
    offset 17  seq        6 bytes  due-set (or parking) sequence, given when
                                   the job is scheduled; 0 = none
    offset 23  created    6 bytes  ms
    offset 29  lease      4 bytes  ms; 0 = the daemon's default
    offset 33  given      6 bytes  the due time as the job was created or
                                   last changed with: `run_at` ms, or
                                   2^47 + `delay` ms, or 2^46 for neither
                                   (the spec JSON leaves both out; a
                                   re-create compares them through this)

  A dead job (x) keeps its dead letter's stream entry id `<ms>-<n>` in seq
  (ms) and lease (n), which mean nothing once it is dead.

  A record's place is a table: {h = hash, id = id} for a live record,
  {k = key} for a kept one; the helpers below read and write either.
]]
local REC_FMT = '>c1I6I2I2I6I6I6I4I6'
local REC_HEADER = 39
local JOB_SHARDS = 64
local GIVEN_DELAY = 140737488355328  -- 2^47
local GIVEN_NEITHER = 70368744177664 -- 2^46
local STATE_NAMES = {s = 'scheduled', w = 'scheduled', p = 'scheduled', o = 'scheduled',
  r = 'ready', i = 'inflight', d = 'delivered', x = 'dead', c = 'cancelled'}

-- The record hash of job `id`: a polynomial of its last four bytes (the
-- store's `job_shard`; cheap, and ids differ most at the end).
local function job_shard(id)
  local n = #id
  if n >= 4 then
    local a, b, c, d = string.byte(id, n - 3, n)
    return (((a * 31 + b) * 31 + c) * 31 + d) % JOB_SHARDS
  end
  local h = 0
  for i = 1, n do h = h * 31 + string.byte(id, i) end
  return h % JOB_SHARDS
end

-- The record hashes' names after the prefix, by shard: made once, as a
-- number in a concatenation is formatted with %.14g on every use.
local JOB_SHARD_NAMES = {}
for shard = 0, JOB_SHARDS - 1 do JOB_SHARD_NAMES[shard] = 'jobs:' .. shard end

-- The record hashes' whole names by partition prefix and shard, each made
-- at its first use and kept while the library is loaded (a concatenation
-- per job cost more; they are at most 64 per partition and namespace).
local JOB_HASH_NAMES = {}

-- The record hashes' names of the partition with prefix `<ns>:{p}:` made
-- so far, by shard (a hot loop reads `names[shard]` itself and calls
-- job_hash_of_shard only for a name not made yet).
local function job_hash_names(prefix)
  local names = JOB_HASH_NAMES[prefix]
  if not names then
    names = {}
    JOB_HASH_NAMES[prefix] = names
  end
  return names
end

-- The name of record hash `shard` of the partition with prefix `<ns>:{p}:`.
local function job_hash_of_shard(prefix, shard)
  local names = job_hash_names(prefix)
  local name = names[shard]
  if not name then
    name = prefix .. JOB_SHARD_NAMES[shard]
    names[shard] = name
  end
  return name
end

-- The name of job `id`'s record hash, from the partition prefix `<ns>:{p}:`.
local function job_hash(prefix, id)
  return job_hash_of_shard(prefix, job_shard(id))
end

-- Where job `id`'s live record is, from the partition prefix `<ns>:{p}:`.
local function live(prefix, id)
  return {h = job_hash(prefix, id), id = id}
end

-- Where job `id`'s kept (finished, whole) record is.
local function kept(prefix, id)
  return {k = prefix .. 'job:' .. id}
end

-- Part of REC_FMT, for the claim's hot path (a struct.unpack of a value
-- of at least REC_HEADER bytes, written out in claim_ready): only the
-- fields it needs (state, att, due, lease), the others skipped ('x'), as
-- values (no table is made for them). (An outcome reads no record: see
-- complete_jobs.)
local REC_CLAIM_FMT = '>c1xxxxxxI2xxI6xxxxxxxxxxxxI4'

local function rec_unpack(v)
  if not v or #v < REC_HEADER then return nil end
  local state, ut, att, max, due, seq, ct, lease, given = struct.unpack(REC_FMT, v)
  -- (One constructor: the table is made at its size, not grown per field.)
  return {state = state, ut = ut, att = att, max = max, due = due, seq = seq, ct = ct,
    lease = lease, given = given}
end

-- The record stored as value `v`, with its spec in `.spec`; nil when `v`
-- is no record (absent, or a pointer: see the end of this prelude).
local function rec_of(v)
  local r = rec_unpack(v)
  if r then r.spec = string.sub(v, REC_HEADER + 1) end
  return r
end

-- The record at `at` with its spec in `.spec`, or nil when there is none.
local function rec_get(at)
  if at.h then return rec_of(redis.call('HGET', at.h, at.id)) end
  return rec_of(redis.call('GET', at.k))
end

local function rec_pack(r)
  return struct.pack(REC_FMT, r.state, r.ut, r.att, r.max, r.due, r.seq, r.ct, r.lease,
    r.given or GIVEN_NEITHER)
end

-- Writes a whole record (header and spec) at `at`.
local function rec_create(at, r, spec)
  local v = rec_pack(r) .. spec
  if at.h then redis.call('HSET', at.h, at.id, v) else redis.call('SET', at.k, v) end
end

-- Rewrites a record read with rec_get (its header, and its spec).
local function rec_put(at, r)
  rec_create(at, r, r.spec)
end

-- Sets a record's state and update time.
local function rec_set_state(at, r, state, now)
  r.state, r.ut = state, now
  rec_put(at, r)
end

-- Whether a record in `state`, due at `due`, waits to be claimed at `now`
-- (see rec_ready below).
local function ready_by(state, due, now)
  return state == 'r' or (state == 's' and due <= now)
end

-- Whether record `r` waits to be claimed: `ready`, or `scheduled` and due
-- (promote_due moves a due job's id to the ready list without writing its
-- record, so a scheduled record whose time has come reads as ready).
local function rec_ready(r, now)
  return ready_by(r.state, r.due, now)
end

-- The API name of record `r`'s state at time `now` (a held job, see the
-- end of this prelude, reads as ready once its due time has passed).
local function state_name(r, now)
  if rec_ready(r, now) or (r.state == 'o' and r.due <= now) then return 'ready' end
  return STATE_NAMES[r.state] or r.state
end

--[[
  In flight. A claim leaves a job's record as it found it (scheduled or
  ready, its attempt counter at the attempts made before) and gives the
  job a lease in its partition's in-flight set: the lease alone says that
  the job is in flight, and its attempt is the counter's next. The step
  that ends the attempt (an outcome, a lease taken back, a give-back, a
  cancel) removes the lease and writes the record. A record of layout 3
  says `i`, its counter at the attempt in flight, and is read the same.
  The jobs a claim takes straight from the promotion share one lease, a
  round (see "Round leases" below), until a step acting on one of them
  turns it into leases of their own.
]]
-- Whether live record `r` may be in flight (its lease decides; see above).
local function rec_may_fly(r)
  return r.state == 'i' or r.state == 's' or r.state == 'r'
end

-- The attempt in flight of live record `r`, whose lease is held.
local function rec_flight_attempt(r)
  if r.state == 'i' then return r.att end
  return r.att + 1
end

-- Whether a live record exists (without reading it).
local function rec_exists(at)
  return redis.call('HEXISTS', at.h, at.id) == 1
end

-- Deletes job `id`'s live record from its record hash `h` (as the hot
-- paths hold it: a name, not a place table).
local function rec_delete_in(h, id)
  redis.call('HDEL', h, id)
end

-- Deletes the live record at `at`.
local function rec_delete(at)
  rec_delete_in(at.h, at.id)
end

-- Moves live record `r` of job `id` to its kept place, expiring after
-- `ttl` ms (a finished job kept whole).
local function rec_keep(prefix, id, r, ttl)
  local at = kept(prefix, id)
  rec_put(at, r)
  redis.call('PEXPIRE', at.k, ttl)
  rec_delete(live(prefix, id))
end

-- The `given` header field for a spec JSON that still holds `run_at` or
-- `delay_ms` (records of layouts 1 and 2).
local function given_of_spec(spec)
  local ok, s = pcall(cjson.decode, spec)
  if ok and type(s) == 'table' then
    if type(s.run_at) == 'number' then return s.run_at end
    if type(s.delay_ms) == 'number' then return GIVEN_DELAY + s.delay_ms end
  end
  return GIVEN_NEITHER
end

-- Marks a record dead, pointing at its dead letter (stream entry id).
local function rec_set_dead(r, entry, now)
  local ms, n = string.match(entry, '^(%d+)-(%d+)$')
  r.state, r.ut, r.seq, r.lease = 'x', now, tonumber(ms) or 0, tonumber(n) or 0
end

-- The due-set (and parking) member of a job: its sequence as 12 hex digits,
-- then its id, so jobs due in the same millisecond keep their order.
-- (`tag` is the job's partition on a single Redis, see due_tag below.)
local function due_member(seq, id, tag)
  return string.format('%012x', seq) .. tag .. id
end

-- On a single Redis a due-set member carries its job's partition, 4 hex
-- digits after the sequence (its tag), so that what takes it out of the
-- shared timers (see "Shared timers" below) knows the job's partition
-- without hashing its id or following a placement pointer; in a cluster
-- a partition's due sets hold its own jobs, and members have no tag.
-- Tags by partition prefix, each made at its first use.
local DUE_TAGS = {}

-- The tag of the jobs of the partition with prefix `<ns>:{p}:`.
local function due_tag(prefix)
  if IN_CLUSTER then return '' end
  local tag = DUE_TAGS[prefix]
  if not tag then
    tag = string.format('%04x', tonumber(string.match(prefix, '{(%d+)}:$')))
    DUE_TAGS[prefix] = tag
  end
  return tag
end

-- Where a due member's id starts (after its sequence and tag).
local DUE_ID_AT = IN_CLUSTER and 13 or 17

-- The partition of a due member's job, by its tag (a single Redis).
local function due_member_partition(member)
  return tonumber(string.sub(member, 13, 16), 16)
end

-- Adds an attempt record to a job's history, keeping the newest 20.
local function history_push(key, record)
  if redis.call('LPUSH', key, record) > 20 then redis.call('LTRIM', key, 0, 19) end
end

--[[
  Dead letters. A partition's stream `<ns>:{p}:dead` holds them oldest
  first, at most `retention.dead_letters_max`; its index, the hash
  `<ns>:{p}:dead:ids`, maps each job id to its newest entry, so that finding
  a job's dead letter reads one entry, never the stream. The index's field
  `~complete` (no job id has a `~`) says that every entry made before the
  index existed has been indexed (`index_dead`).
]]

-- Deletes dead-letter entry `entry` of job `id`, and the index's pointer
-- to it (a pointer to a newer entry of the job stays).
local function dead_forget(stream, index, id, entry)
  redis.call('XDEL', stream, entry)
  if id and redis.call('HGET', index, id) == entry then redis.call('HDEL', index, id) end
end

-- The job id of a stream entry as XRANGE returns it ({entry id, fields}).
local function dead_entry_job(entry)
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'id' then return fields[i + 1] end
  end
  return nil
end

-- Appends a job's dead letter to the partition's stream and indexes it;
-- past the cap the oldest entries go (at most 8 per call, so a lowered
-- cap is reached over later calls). Returns the entry id. `given` is the
-- record's (the spec JSON leaves the due time out).
local function dead_letter(stream, index, max_len, id, topic, attempts, last_error, last_status,
    spec, now, given)
  local entry = redis.call('XADD', stream, '*',
    'id', id, 'topic', topic, 'attempts', attempts, 'last_error', last_error,
    'last_status', last_status, 'job', spec, 'dead_at', string.format('%d', now),
    'given', string.format('%d', given or GIVEN_NEITHER))
  redis.call('HSET', index, id, entry)
  local over = redis.call('XLEN', stream) - tonumber(max_len)
  if over > 0 then
    for _, old in ipairs(redis.call('XRANGE', stream, '-', '+', 'COUNT', math.min(over, 8))) do
      dead_forget(stream, index, dead_entry_job(old), old[1])
    end
  end
  return entry
end

-- The topic in a spec JSON ('default' when absent or unreadable).
local function spec_topic(spec)
  local ok, decoded = pcall(cjson.decode, spec)
  if ok and type(decoded) == 'table' and type(decoded.topic) == 'string' then
    return decoded.topic
  end
  return 'default'
end

-- Wake messages on partition p's channel `<channel>:<p>` (only the daemon
-- that has the partition listens; see src/fleet.rs): `d<p>:<ms>` a new
-- earliest due time of partition p; `r<p>` p's ready list stopped being
-- empty.
local function wake_due(channel, p, due)
  -- (On a single Redis every partition's due jobs are partition 0's to
  -- promote: see "Shared timers" below.)
  if not IN_CLUSTER then p = 0 end
  redis.call('PUBLISH', channel .. ':' .. p, 'd' .. p .. ':' .. string.format('%d', due))
end
local function wake_ready(channel, p)
  redis.call('PUBLISH', channel .. ':' .. p, 'r' .. p)
end

--[[
  Ready lists, one per tenant (SPEC §15). A due job waits for a worker in
  its tenant's list: `<ns>:{p}:ready` for the `default` tenant (as before
  tenants), `<ns>:{p}:ready:<tenant>` for another, whose jobs' ids are
  `<tenant>/<id>`. The SET `<ns>:{p}:tenants` names the other tenants whose
  list may hold ids (a tenant enters it when its list starts, and leaves it
  when a claim empties the list), so a claim finds every list without a
  scan, and a partition with only default jobs pays one SCARD per claim.
]]

-- The key of job `id`'s tenant in a structure kept per tenant (ready
-- lists, due sets), from the default tenant's `key`: `key` itself for the
-- default tenant, `<key>:<tenant>` for another; and the tenant (nil for
-- `default`).
local function of_tenant(key, id)
  local slash = string.find(id, '/', 1, true)
  if not slash then return key, nil end
  local tenant = string.sub(id, 1, slash - 1)
  return key .. ':' .. tenant, tenant
end

-- Whether pushing `ids` may create a tenant's ready list, a key the script
-- builds, while the partition's slot is moving (see the top of the
-- prelude): the script then gives up before its first write.
local function ready_push_blocked(ready_key, ids)
  if not IN_CLUSTER then return false end
  for _, id in ipairs(ids) do
    local key, tenant = of_tenant(ready_key, id)
    if tenant and redis.call('EXISTS', key) == 0 then return slot_moving_once(ready_key) end
  end
  return false
end

-- Appends `ids` to their tenants' ready lists (`ready_key` is the default
-- tenant's); true when a list was empty before (the partition's claim loop
-- may be asleep: the caller wakes it).
local function ready_push(ready_key, ids)
  if #ids == 0 then return false end
  local lists, order = {}, {}
  for _, id in ipairs(ids) do
    local key, tenant = of_tenant(ready_key, id)
    local list = lists[key]
    if not list then
      list = {tenant = tenant}
      lists[key] = list
      order[#order + 1] = key
    end
    list[#list + 1] = id
  end
  local started = false
  for _, key in ipairs(order) do
    local list = lists[key]
    local n = 0
    for first = 1, #list, 1000 do
      n = redis.call('RPUSH', key, unpack(list, first, math.min(first + 999, #list)))
    end
    if n == #list then
      started = true
      if list.tenant then
        redis.call('SADD', string.sub(ready_key, 1, -6) .. 'tenants', list.tenant)
      end
    end
  end
  return started
end

--[[
  Due sets. A scheduled job waits for its due time in its tenant's due set
  (SPEC §15): the ZSET `<ns>:{p}:due` for the default tenant's jobs,
  `<ns>:{p}:due:<tenant>` for another's, scored by due time (members:
  due_member). The partition's ZSET `<ns>:{p}:due-tenants` names every other
  tenant whose set may hold jobs, scored at most its set's earliest due
  time (a cancel may leave the score early; promotion sets it right). So a
  promotion finds the tenants with jobs due in one read and takes a share
  from each: one tenant's backlog of due jobs does not hold another
  tenant's jobs behind it (the fair share starts before the ready lists).
  With only default jobs, nothing is written to the index, and a promotion
  pays one read of it.

  The first tenants layout kept every tenant's jobs in `<ns>:{p}:due`:
  promotion still moves such a job to its own tenant's ready list, and
  taking a tenant's job out of its due set also takes it out of the
  default one.
]]

-- The index of the tenants' due sets, from the default set's key.
local function due_index(due_key)
  return due_key .. '-tenants'
end

-- Whether adding `ids` to (or taking them out of) their tenants' due sets
-- may touch a key absent here while the partition's slot is moving (see
-- the top of the prelude): the script then gives up before its first
-- write.
local function due_blocked(due_key, ids)
  if not IN_CLUSTER then return false end
  for _, id in ipairs(ids) do
    local key, tenant = of_tenant(due_key, id)
    if tenant and (redis.call('EXISTS', key) == 0 or redis.call('EXISTS', due_index(due_key)) == 0) then
      return slot_moving_once(due_key)
    end
  end
  return false
end

-- Jobs bound for due sets, grouped per set in the order first seen, so a
-- batch costs one ZADD per set (and one per tenant on the index).
local function due_batch()
  return {keys = {}, by_key = {}}
end

local function due_batch_add(batch, due_key, id, due, seq, prefix)
  local key, tenant = of_tenant(due_key, id)
  local set = batch.by_key[key]
  if not set then
    set = {tenant = tenant, args = {}, earliest = due}
    batch.by_key[key] = set
    batch.keys[#batch.keys + 1] = key
  end
  set.args[#set.args + 1] = string.format('%d', due)
  set.args[#set.args + 1] = due_member(seq, id, due_tag(prefix))
  if due < set.earliest then set.earliest = due end
end

local function due_batch_push(due_key, batch)
  for _, key in ipairs(batch.keys) do
    local set = batch.by_key[key]
    -- In chunks: unpack is bounded by Lua's stack.
    for first = 1, #set.args, 2000 do
      redis.call('ZADD', key, unpack(set.args, first, math.min(first + 1999, #set.args)))
    end
    if set.tenant then
      redis.call('ZADD', due_index(due_key), 'LT', string.format('%d', set.earliest), set.tenant)
    end
  end
end

-- Adds job `id` (sequence `seq`) of the partition with prefix `prefix`,
-- due at `due`, to its tenant's due set.
local function due_add(due_key, id, due, seq, prefix)
  local batch = due_batch()
  due_batch_add(batch, due_key, id, due, seq, prefix)
  due_batch_push(due_key, batch)
end

-- Takes job `id` (sequence `seq`) of the partition with prefix `prefix`
-- out of its tenant's due set.
local function due_remove(due_key, id, seq, prefix)
  local key, tenant = of_tenant(due_key, id)
  local member = due_member(seq, id, due_tag(prefix))
  redis.call('ZREM', key, member)
  -- (Where the first tenants layout put it.)
  if tenant then redis.call('ZREM', due_key, member) end
end

-- The score of the member of sorted set `key` at rank `n` (0: its head),
-- or nil when it has no more: a due set's or index's due time after its
-- first `n`, the wheel's next bucket to open.
local function score_at_rank(key, n)
  local rank = int_text(n)
  return tonumber(redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')[2])
end

-- The earliest due time of the partition's due sets (the index's head
-- may be early, never late); nil when they are empty.
local function due_head(due_key)
  local a = score_at_rank(due_key, 0)
  local b = score_at_rank(due_index(due_key), 0)
  if a and b then return math.min(a, b) end
  return a or b
end

--[[
  The timing wheel. A job due far ahead does not wait in the due set (a
  sorted-set entry costs ~140 bytes); it waits as a bare id in a bucket, a
  LIST `<ns>:{p}:wheel:<level>:<start ms>` holding the jobs due in
  [start, start + width) of its level (list entries cost ~28 bytes). The
  partition's ZSET `<ns>:{p}:wheel` lists the buckets, scored by when each
  opens: a little before its start (its level's lead). Opening a bucket (in
  promote_due) moves each of its jobs on to a finer bucket or, when near,
  into the due set, so a job waits in a coarse bucket while far away and in
  the due set only for its last minute or so.

  A job in the wheel has state `w`. Cancelling or changing it leaves its id
  in its bucket as a tombstone: when the bucket opens, only ids whose record
  still says `w` move on (a changed job has a new entry of its own; moving a
  stale duplicate first is harmless, since a record moves by what it says).
  The stats hash's `wheel` field counts records in state `w`.

  The finest width is `redis.wheel_bucket` (WHEEL_BUCKET, defined above
  this prelude like IN_CLUSTER; 2^16 ms by default); each level is 64 times
  wider than the one below and opens a sixteenth of its width early:

    level  default width   lead      holds jobs due at least one width ahead
      1    ~65 s           ~4 s
      2    ~70 min         ~4.4 min
      3    ~3.1 days       ~4.7 h
]]
local WHEEL_WIDTHS = {WHEEL_BUCKET, WHEEL_BUCKET * 64, WHEEL_BUCKET * 4096}

-- `<ns>:{p}:` from one of the partition's key names, e.g.
-- partition_prefix(KEYS[1], 'due') for `<ns>:{p}:due`.
local function partition_prefix(key, name)
  return string.sub(key, 1, -#name - 1)
end

--[[
  Shared timers. On a single Redis (not IN_CLUSTER) the store names one
  set of due sets and one wheel for every partition, under the prefix
  `<ns>:{0}:t:` (src/store/keys.rs): every job waits for its time there,
  whatever its partition, so that a round of the carrier is one promotion
  and one claim however many partitions its jobs live in (a due set per
  partition cost a claim per partition with a job due,
  docs/performance.md). Everything else (records, ready lists, leases,
  summaries, stats) stays in the job's own partition: what takes ids out
  of the shared timers acts on each one's partition, named by its tag
  (due_tag above): a due member is `<seq><tag><id>`, a wheel bucket's
  entry `<tag><id>`. (Not the id's hash: a job placed by its ordering key
  and a job a schedule fired live in another partition than their id's.)
  In a cluster each partition keeps its own timers, untagged (a script
  stays on one slot).
]]

-- The prefix of the timing structures of due set `due_key` (its tenants'
-- sets, their index, the wheel and its buckets): `<ns>:{0}:t:` on a single
-- Redis, the partition's own `<ns>:{p}:` in a cluster.
local function timers_prefix(due_key)
  return partition_prefix(due_key, 'due')
end

-- Partition prefixes `<ns>:{q}:` by namespace prefix `<ns>:` and
-- partition, each made at its first use (as JOB_HASH_NAMES).
local PARTITION_PREFIXES = {}

-- The namespace prefix `<ns>:` of a partition's prefix `<ns>:{p}:` (or of
-- the shared timers' `<ns>:{0}:t:`).
local function namespace_prefix(prefix)
  return string.match(prefix, '^(.-){%d+}:')
end

-- `<ns>:{q}:` from the namespace prefix `<ns>:`.
local function prefix_of_partition(ns, q)
  local by_q = PARTITION_PREFIXES[ns]
  if not by_q then
    by_q = {}
    PARTITION_PREFIXES[ns] = by_q
  end
  local prefix = by_q[q]
  if not prefix then
    prefix = ns .. '{' .. q .. '}:'
    by_q[q] = prefix
  end
  return prefix
end

-- The partition a live-record value points to, or nil when it is not a
-- pointer.
local function pointer_of(v)
  if v and #v < REC_HEADER and string.sub(v, 1, 1) == '@' then return tonumber(string.sub(v, 2)) end
  return nil
end

-- The default tenant's due set of the partition with prefix `prefix`: its
-- own in a cluster, the shared one on a single Redis.
local function due_key_of(prefix)
  if IN_CLUSTER then return prefix .. 'due' end
  return prefix_of_partition(namespace_prefix(prefix), 0) .. 't:due'
end

-- A wheel bucket's entry for job `id` of the partition with prefix
-- `prefix`: the id, after its partition's tag on a single Redis.
local function wheel_entry(prefix, id)
  return due_tag(prefix) .. id
end

-- The id of a wheel bucket's entry, and (on a single Redis, `ns` the
-- namespace prefix) the prefix of its job's partition, by its tag.
local function wheel_entry_job(ns, entry)
  if not ns then return entry, nil end
  return string.sub(entry, 5), prefix_of_partition(ns, tonumber(string.sub(entry, 1, 4), 16))
end

--[[
  Round leases. A claim that takes its jobs straight from the promotion
  (a steady load's usual case) gives them one lease together instead of
  one each: a round. Its token, `<deadline>/<n>`, is a member of
  the round space's `rounds` set, scored by the round's deadline (its
  latest job's); the `round` hash holds, under the token, its jobs'
  entries (wheel_entry: the id after its partition's tag on a single
  Redis), each between spaces, and under `<token>#` how many of them have
  not ended. The round space is the shared timers' prefix on a single
  Redis (one round a claim, whatever partitions its jobs live in), the
  partition's own in a cluster. A token is unique (its second part counts
  the space's rounds, in the hash's field `next`) and is its jobs'
  fencing token: an outcome is current while its round lives
  (complete_jobs), and ends its job's part of the round. Every other step
  that acts on one job in flight (a failure, a give-back, a cancel, a
  lease taken back) first turns its round into leases of its jobs' own,
  scored by the deadline the token names (`materialize`), and then works
  on per-job leases as before rounds; an outcome whose round was
  materialized is fenced by its job's lease.
]]

-- The longest claim ahead (config MAX_CLAIM_AHEAD, ms): a scheduled job
-- due later than this after now is in no round.
local MAX_CLAIM_AHEAD_MS = 50

-- The round space of the partition with prefix `prefix` (see above).
local function round_space(prefix)
  if IN_CLUSTER then return prefix end
  return prefix_of_partition(namespace_prefix(prefix), 0) .. 't:'
end

-- The deadline round token `token` names, or nil when it names none (a
-- per-job lease's token is its deadline alone).
local function round_deadline(token)
  return tonumber(string.match(token, '^(%d+)/'))
end

-- Turns round `token` of round space `space` into leases of its jobs'
-- own, scored by its deadline (for the jobs whose record is live and may
-- fly: one whose outcome was recorded has no live record), and ends it.
-- With `leased_in` (a table), notes there the partitions (by number, on a
-- single Redis) whose jobs got a lease. While the slot is being migrated
-- (a record not found may not have arrived), raises TRYAGAIN having
-- changed nothing.
local function round_materialize(space, token, leased_in)
  local rcall = redis.call
  local value = rcall('HGET', space .. 'round', token)
  if value then
    local deadline = round_deadline(token)
    local ns = not IN_CLUSTER and namespace_prefix(space) or nil
    local flying = {}
    for entry in string.gmatch(value, '[^ ]+') do
      local id, prefix = wheel_entry_job(ns, entry)
      prefix = prefix or space
      local r = rec_get(live(prefix, id))
      if not r and slot_moving_once(space .. 'rounds') then error(try_again()) end
      if r and rec_may_fly(r) then
        flying[#flying + 1] = {prefix .. 'inflight', id}
        if leased_in and ns then leased_in[tonumber(string.sub(entry, 1, 4), 16)] = true end
      end
    end
    for _, lease in ipairs(flying) do rcall('ZADD', lease[1], deadline, lease[2]) end
  end
  rcall('HDEL', space .. 'round', token, token .. '#')
  rcall('ZREM', space .. 'rounds', token)
end

-- The token of the live round holding job `id` of the partition with
-- prefix `prefix`, and the round space, or nil: the rounds' values are
-- read a thousand at a time (the most arguments a call takes) and
-- searched for its entry. (Not through round_index: a failure or a cancel
-- at a steady load would then keep every live round's entries in the
-- library between calls, and the size of Lua's state is what every call
-- of every function pays for: docs/performance.md.)
local function round_holding(prefix, id)
  local space = round_space(prefix)
  local tokens = redis.call('ZRANGE', space .. 'rounds', 0, -1)
  local needle = ' ' .. wheel_entry(prefix, id) .. ' '
  for from = 1, #tokens, 1000 do
    local values = redis.call('HMGET', space .. 'round', unpack(tokens, from, math.min(from + 999, #tokens)))
    for i = 1, #values do
      local v = values[i]
      if v and string.find(v, needle, 1, true) then return tokens[from + i - 1], space end
    end
  end
  return nil
end

-- The live rounds' entries by round space, each to its round's token,
-- kept from call to call while the library is loaded (a round's entries
-- never change once written and a token is never used again, so a call
-- reads only the rounds that started since the last): per space
-- `{tokens = {token -> its entries}, of = {entry -> token}}`.
local ROUND_INDEX = {}

-- Entry -> token of the jobs in the live rounds of round space `space`,
-- or nil when no round lives (a claim's check that a job it took from a
-- list is in no round: see claim_ready).
local function round_index(space)
  local rcall = redis.call
  local tokens = rcall('ZRANGE', space .. 'rounds', 0, -1)
  if #tokens == 0 then
    ROUND_INDEX[space] = nil
    return nil
  end
  local index = ROUND_INDEX[space]
  if not index then
    index = {tokens = {}, of = {}}
    ROUND_INDEX[space] = index
  end
  local live, new = {}, {}
  for _, token in ipairs(tokens) do
    live[token] = true
    if not index.tokens[token] then new[#new + 1] = token end
  end
  -- (Fields set to nil while traversed: allowed.)
  for token, entries in pairs(index.tokens) do
    if not live[token] then
      for _, entry in ipairs(entries) do
        if index.of[entry] == token then index.of[entry] = nil end
      end
      index.tokens[token] = nil
    end
  end
  for from = 1, #new, 1000 do
    local chunk = {unpack(new, from, math.min(from + 999, #new))}
    local values = rcall('HMGET', space .. 'round', unpack(chunk))
    for i, token in ipairs(chunk) do
      local entries = {}
      for entry in string.gmatch(values[i] or '', '[^ ]+') do
        entries[#entries + 1] = entry
        index.of[entry] = token
      end
      index.tokens[token] = entries
    end
  end
  return index.of
end

-- Whether live record `r` of job `id` is in flight: a lease of it is in
-- the in-flight set `inflight_key`, or its round lives (the round is then
-- materialized, so that the caller finds the job's lease: see above), or
-- the record says `i` (layout 3).
local function rec_in_flight(r, inflight_key, id)
  if r.state == 'i' then return true end
  if not rec_may_fly(r) then return false end
  if redis.call('ZSCORE', inflight_key, id) then return true end
  -- (A claim takes a scheduled job at most MAX_CLAIM_AHEAD_MS early.)
  if r.state == 's' and r.due > now_ms() + MAX_CLAIM_AHEAD_MS then return false end
  local token, space = round_holding(partition_prefix(inflight_key, 'inflight'), id)
  if not token then return false end
  round_materialize(space, token)
  return true
end

-- The API name of the state of live record `r` of job `id` at `now`,
-- reading its lease in `inflight_key` (see state_name).
local function live_state_name(r, now, inflight_key, id)
  if rec_in_flight(r, inflight_key, id) then return 'inflight' end
  return state_name(r, now)
end

-- Where a scheduled job due at `due` waits at time `now`: its bucket's
-- name `<level>:<start>` and opening time, or nil for the due set.
local function wheel_slot(due, now)
  for level = #WHEEL_WIDTHS, 1, -1 do
    local width = WHEEL_WIDTHS[level]
    if due - now >= width then
      local start = due - due % width
      local opens = start - math.floor(width / 16)
      if opens > now then return level .. ':' .. string.format('%d', start), opens end
    end
  end
  return nil
end

-- Appends ids to bucket `slot`; a new bucket joins the wheel's index.
-- Returns true when the bucket is new.
local function wheel_push(prefix, slot, opens, ids)
  local key, n = prefix .. 'wheel:' .. slot, 0
  -- In chunks: unpack is bounded by Lua's stack.
  for first = 1, #ids, 1000 do
    n = redis.call('RPUSH', key, unpack(ids, first, math.min(first + 999, #ids)))
  end
  if n == #ids then
    redis.call('ZADD', prefix .. 'wheel', string.format('%d', opens), slot)
    return true
  end
  return false
end

-- Ids bound for wheel buckets, grouped per bucket in the order first seen,
-- so a batch costs one RPUSH per bucket.
local function wheel_batch()
  return {slots = {}, by_slot = {}}
end

local function wheel_batch_add(batch, slot, opens, id)
  local bucket = batch.by_slot[slot]
  if not bucket then
    bucket = {opens = opens, ids = {}}
    batch.by_slot[slot] = bucket
    batch.slots[#batch.slots + 1] = slot
  end
  bucket.ids[#bucket.ids + 1] = id
end

-- Pushes a batch; returns the earliest opening among buckets it created.
local function wheel_batch_push(prefix, batch)
  local earliest = nil
  for _, slot in ipairs(batch.slots) do
    local bucket = batch.by_slot[slot]
    if wheel_push(prefix, slot, bucket.opens, bucket.ids)
      and (not earliest or bucket.opens < earliest) then
      earliest = bucket.opens
    end
  end
  return earliest
end

-- The earliest time the partition has work: the due set's head or the
-- wheel's next bucket to open; nil when there is neither.
local function next_wake(due_key)
  local a = due_head(due_key)
  local b = score_at_rank(timers_prefix(due_key) .. 'wheel', 0)
  if a and b then return math.min(a, b) end
  return a or b
end

-- Counts records entering (+n) or leaving (-n) the wheel.
local function wheel_count(prefix, delta)
  if delta ~= 0 then redis.call('HINCRBY', prefix .. 'stats', 'wheel', delta) end
end

--[[
  Schedules the record `r` of job `id` (its due, seq set) for its due time:
  into the wheel (state w) when far ahead, else into the due set (state s).
  Writes the record (live). Returns the time the carrier must act for it when that
  may be earlier than before (its due time, or a new bucket's opening), else
  nil. The caller counts a record entering the wheel (r.state == 'w').
]]
local function schedule(prefix, due_key, id, r, now)
  local at = live(prefix, id)
  local slot, opens = wheel_slot(r.due, now)
  if slot then
    r.state = 'w'
    rec_put(at, r)
    if wheel_push(timers_prefix(due_key), slot, opens, {wheel_entry(prefix, id)}) then return opens end
    return nil
  end
  r.state = 's'
  rec_put(at, r)
  due_add(due_key, id, r.due, r.seq, prefix)
  return r.due
end

--[[
  Finished-job summaries. A delivered or cancelled job (unless
  `retention.keep_bodies`) leaves no record: its record and history are
  deleted and a summary of at most 64 bytes remains, one field of a small
  hash. A key of its own would cost ~150 bytes before any content; a field
  of a listpack hash (stock `hash-max-listpack-entries` 128, `-value` 64)
  costs its id and value plus a few bytes.

  Summaries are grouped by finish time into buckets `retention / 4` wide
  (they expire a whole bucket at a time, retention to 1.25 x retention after
  their finish); each bucket is a linear hash of shards, split one at a time
  as it fills, so a shard holds about SUMMARY_LOAD fields (never so many that
  it leaves the listpack encoding for long). A split reads its whole shard
  and hashes every id in it, which cost Redis more than the writes it
  spares, so a new bucket starts with the shards it is likely to need
  (summary_presize): as many as the bucket before it filled, or, with none
  just before it, as many as the partition's live jobs would. A shard is
  made by its first write, which gives it the bucket's expiry (PEXPIREAT
  NX); shards nobody wrote to do not exist. Every write also sets the
  shard's mark (SUMMARY_MARK, an empty field `#`), so that its HSET's count
  of new fields tells the write that made the shard (the mark was new)
  from the others, which need no PEXPIREAT; a shard a split empties keeps
  only its mark (one made before marks goes):

    <ns>:{p}:done                  HASH  <bucket start ms> -> "<shards>:<count>:<expires ms>"
    <ns>:{p}:done:<bucket>:<shard> HASH  <id> -> summary, `#` -> "" (the mark), PEXPIREAT <expires>

  A summary, big-endian: state c1 (d or c), attempts I2, max I2, created I6,
  finished I6, then the tail the finishing step supplies: the content
  digest the daemon computes (8 bytes; so an identical re-create is still
  known as one),
  the last attempt's start I6 (0: none), duration ms I4 and status I2 (0:
  none), the topic's length I1 and the topic, then the last error text
  (`kind: message`) cut so the summary stays within 64 bytes.

  Earlier attempts (a job that needed more than one) follow the topic in
  compact form; the topic length's high bit (topics have at most 64 bytes)
  says they do, and a summary without it (every summary written before
  them) has none. Then: a count I1 (low 7 bits: the earlier attempts kept;
  high bit: the newest kept is attempt `attempts - 1`, because a cancel
  found an attempt in flight), and per earlier attempt, newest first, 11
  bytes: its start as ms before the finish I5, its duration ms I4, and
  its status or error kind I2 (100..999 the HTTP status, whose kind is
  redirect for a 3xx and http_status otherwise; 1000 + i the i-th of
  SUMMARY_KINDS; 1999 another kind; 0 unknown); then the last error text.
  A message of an earlier attempt is not kept, nor (as for the last one)
  its response excerpt.

  When the whole is more than 64 bytes it goes in 64-byte pieces: the
  first is the id's field, piece k + 1 the field `#<k><id>` of the same
  shard (no id has a `#`; k is one digit: a history list keeps 20
  attempts, and a summary at most 30 earlier ones). A piece shorter than
  64 bytes is the last. The pieces are as few as the head, topic, entries
  and the error text's first SUMMARY_ERROR_MIN bytes need (a cancelled
  job's last error keeps its kind and the start of its message); the rest
  of the text fills the last one. So a job delivered on its second attempt
  costs 12 bytes more than on its first (count and entry), within its
  value while its topic has at most 14 bytes; each field more costs its
  name (the id and 2 bytes) besides. An attempt before the 21st newest is
  not kept: the history list keeps 20, and the summary what the list held.
  The bucket's count is of fields, so that a shard splits by fields and
  stays a listpack however long the histories.

  The Rust store computes the same id hash and shard address to read one.
]]
local SUMMARY_HEAD = '>c1I2I2I6I6'
local SUMMARY_HEAD_LEN = 17   -- bytes of SUMMARY_HEAD
local SUMMARY_TAIL_FIXED = 21 -- digest 8, last attempt 12, topic length 1
local SUMMARY_LOAD = 40
local SUMMARY_PRESIZE_MAX = 65536 -- shards a new bucket starts with, at most
-- A field of every shard written since the mark came in: a continuation's
-- name with no id, empty, which no reader takes for a summary. A write
-- names it too, so the count of new fields its HSET answers says whether
-- the write made the shard (then the mark was new as well).
local SUMMARY_MARK = '#'
local SUMMARY_MAX = 64
local SUMMARY_ERROR_MIN = 32 -- bytes of error text a summary with history keeps
local SUMMARY_ENTRY = '>I5I4I2' -- an earlier attempt: 11 bytes
local SUMMARY_KINDS = {'http_status', 'redirect', 'timeout', 'connect', 'ssrf_blocked',
  'request', 'invalid_job', 'lease_expired'}
local SUMMARY_KIND_CODE = {}
for i, kind in ipairs(SUMMARY_KINDS) do SUMMARY_KIND_CODE[kind] = 1000 + i end

-- The 32-bit hash of an id that places it in a summary shard (the store's
-- `id_hash`): a polynomial over its last 8 bytes (where ids differ; exact
-- in Lua's doubles), then one round of murmur3's finaliser so that ids
-- differing only in their last characters spread over every shard. Cheap
-- on purpose: it runs for every summary written and looked up, and for each
-- entry a shard split moves.
local function id_hash(id)
  local n, h = #id, 0
  if n >= 8 then
    local a, b, c, d, e, f, g, k = string.byte(id, n - 7, n)
    h = ((((((a * 31 + b) * 31 + c) * 31 + d) * 31 + e) * 31 + f) * 31 + g) * 31 + k
  else
    for i = 1, n do h = h * 31 + string.byte(id, i) end
  end
  h = h % 4294967296
  h = bit.bxor(h, bit.rshift(h, 16)) % 4294967296
  -- h * 0x85ebca6b mod 2^32 in 16-bit halves (0x85eb, 0xca6b), exact in
  -- Lua's doubles; written out, as calls cost more than the arithmetic
  local lo = h % 65536
  h = (((lo * 0x85eb + (h - lo) / 65536 * 0xca6b) % 65536) * 65536 + lo * 0xca6b) % 4294967296
  return bit.bxor(h, bit.rshift(h, 13)) % 4294967296
end

-- The largest power of two not above `n`: a bucket of `n` shards has
-- split its first `n - base` shards into those and `base` .. `n - 1`.
local function split_base(n)
  local base = 1
  while base * 2 <= n do base = base * 2 end
  return base
end

-- The shard of hash `h` in a bucket of `n` shards (linear hashing).
local function summary_shard(h, n)
  local base = split_base(n)
  local a = h % (base * 2)
  if a >= n then a = h % base end
  return a
end

local function summary_key(prefix, bucket, shard)
  return prefix .. 'done:' .. bucket .. ':' .. int_text(shard)
end

-- A summary: its head, for record `r` finished (state `state`) at `now`,
-- then the tail.
local function summary_of(state, att, max, ct, now, tail)
  return struct.pack(SUMMARY_HEAD, state, att, max, ct, now) .. tail
end

local function summary_bucket_meta(value)
  local n, count, expires = string.match(value or '', '^(%d+):(%d+):(%d+)$')
  if not n then return nil end
  return tonumber(n), tonumber(count), tonumber(expires)
end

-- The newest summary of job `id` as {state, att, max, ct, ft, digest}, or nil.
-- `meta` is the partition's bucket index (HGETALL of `done`) when the
-- caller has read it already (one read for a batch), else nil.
local function summary_find(prefix, id, now, meta)
  meta = meta or redis.call('HGETALL', prefix .. 'done')
  local h, best = id_hash(id), nil
  for i = 1, #meta, 2 do
    local n, _, expires = summary_bucket_meta(meta[i + 1])
    if n and expires > now then
      local v = redis.call('HGET', summary_key(prefix, meta[i], summary_shard(h, n)), id)
      if v and #v >= SUMMARY_HEAD_LEN + 8 then
        local s = {}
        s.state, s.att, s.max, s.ct, s.ft = struct.unpack(SUMMARY_HEAD, v)
        s.digest = string.sub(v, SUMMARY_HEAD_LEN + 1, SUMMARY_HEAD_LEN + 8)
        if not best or s.ft > best.ft then best = s end
      end
    end
  end
  return best
end

-- The tail of a summary (see above) for a spec, its content digest and
-- its last attempt record JSON (or nil), as the cancel step writes it;
-- completions get theirs whole from the daemon, which holds all three.
-- The error text is cut later, by summary_pieces.
local function summary_tail(spec, digest, last_attempt)
  local topic = spec_topic(spec)
  local at, took, status, err = 0, 0, 0, ''
  local ok, a = pcall(cjson.decode, last_attempt or '')
  if ok and type(a) == 'table' then
    at, took, status = tonumber(a.at) or 0, tonumber(a.duration_ms) or 0, tonumber(a.status) or 0
    if type(a.error) == 'string' then
      err = a.error
      if type(a.message) == 'string' then err = err .. ': ' .. a.message end
    end
  end
  return digest .. struct.pack('>I6I4I2I1', at, took, status, math.min(#topic, 127))
    .. string.sub(topic, 1, 127) .. string.sub(err, 1, 2 * SUMMARY_MAX)
end

-- An earlier attempt's record JSON as a compact entry (see above), for a
-- summary finished at `now`.
local function summary_entry(json, now)
  local ok, a = pcall(cjson.decode, json)
  if not ok or type(a) ~= 'table' then a = {} end
  local at, took, status = tonumber(a.at) or now, tonumber(a.duration_ms) or 0, tonumber(a.status) or 0
  local code = 0
  if status >= 100 and status <= 999 then
    code = status
  elseif type(a.error) == 'string' then
    code = SUMMARY_KIND_CODE[a.error] or 1999
  end
  return struct.pack(SUMMARY_ENTRY, math.min(math.max(now - at, 0), 1099511627775),
    math.min(math.max(took, 0), 4294967295), code)
end

-- The compact entries of attempt records `hist` (JSON, newest first) from
-- index `from` on, for a summary finished at `now`: a list of strings.
local function summary_entries(hist, from, now)
  local entries = {}
  -- (At most 30: a summary has at most 10 pieces; the history list
  -- keeps 20.)
  for i = from, math.min(#hist, from + 29) do entries[#entries + 1] = summary_entry(hist[i], now) end
  return entries
end

--[[
  The field values of a summary (see above): `value` (summary_of's, its
  error text not yet cut) with its earlier attempts `entries` (from
  summary_entries), `behind` when the newest of them is attempt
  `attempts - 1`. A list of pieces, each at most SUMMARY_MAX bytes: the
  first is the id's field, the others its continuation fields. A summary
  of one piece (a job delivered on its first attempt) is that piece, a
  string, so that the usual case makes no table (on a steady load Redis
  pays more for each Lua table than for a command; see
  docs/performance.md). summary_field_count counts either.
]]
local function summary_pieces(value, entries, behind)
  -- (Within one piece as it is: the usual case.)
  if #value <= SUMMARY_MAX and #entries == 0 and not behind then return value end
  local topic_len = string.byte(value, SUMMARY_HEAD_LEN + SUMMARY_TAIL_FIXED)
  local base = SUMMARY_HEAD_LEN + SUMMARY_TAIL_FIXED + topic_len
  if #entries == 0 and not behind then return string.sub(value, 1, math.max(SUMMARY_MAX, base)) end
  local count = #entries
  if behind then count = count + 128 end
  local blob = string.sub(value, 1, base - topic_len - 1) .. string.char(topic_len + 128)
    .. string.sub(value, base - topic_len + 1, base) .. string.char(count) .. table.concat(entries)
  -- As few pieces as the blob and the error text's first
  -- SUMMARY_ERROR_MIN bytes need; the rest of the text fills the last one.
  local err = string.sub(value, base + 1)
  local size = math.ceil((#blob + math.min(#err, SUMMARY_ERROR_MIN)) / SUMMARY_MAX) * SUMMARY_MAX
  blob = blob .. string.sub(err, 1, size - #blob)
  local pieces = {}
  for at = 1, #blob, SUMMARY_MAX do pieces[#pieces + 1] = string.sub(blob, at, at + SUMMARY_MAX - 1) end
  return pieces
end

-- The fields a summary (from summary_pieces) takes.
local function summary_field_count(pieces)
  if type(pieces) == 'string' then return 1 end
  return #pieces
end

-- Puts the fields of summary `pieces` (from summary_pieces) of job `id`,
-- name then value, into `args` after its first `n`; returns the new count.
local function summary_args(args, n, id, pieces)
  if type(pieces) == 'string' then
    args[n + 1], args[n + 2] = id, pieces
    return n + 2
  end
  for k, piece in ipairs(pieces) do
    if k == 1 then args[n + 1] = id else args[n + 1] = '#' .. (k - 1) .. id end
    args[n + 2] = piece
    n = n + 2
  end
  return n
end

-- How many shards a new bucket of the partition with key prefix `prefix`
-- starts with (see the layout above): as many as the fields of the bucket
-- that started at `previous` (the span before it) need, or, when there is
-- none, as many as its live jobs' summaries would; at least 1.
local function summary_presize(prefix, previous)
  local _, fields = summary_bucket_meta(redis.call('HGET', prefix .. 'done', string.format('%d', previous)))
  if not fields then
    fields = 0
    for shard = 0, JOB_SHARDS - 1 do fields = fields + redis.call('HLEN', job_hash_of_shard(prefix, shard)) end
  end
  return math.min(math.max(1, math.ceil(fields / SUMMARY_LOAD)), SUMMARY_PRESIZE_MAX)
end

--[[
  Where summaries finished at `now` go: the bucket, its shards before and
  after the writes, and (in a cluster) whether every key to be written is
  here. `fields` is how many fields the summaries take (their ids and
  continuation fields; #ids when nil): a bucket's count is of fields, so
  that a shard stays within the listpack encoding however long the
  histories. `hashes[i]` is id_hash(ids[i]) when the caller has it (nil:
  computed here). Returns nil when a key is absent because the slot is moving
  (the caller gives up, see the top of this prelude). Reads only.
]]
local function summaries_plan(prefix, ids, now, retention, fields, hashes)
  local width = math.max(1, math.floor(retention / 4))
  local start = now - now % width
  local plan = {bucket = string.format('%d', start), n = 1, count = 0,
    expires = start + width + retention, shards = {}, fields = fields or #ids}
  local meta = redis.call('HGET', prefix .. 'done', plan.bucket)
  local n, count, expires = summary_bucket_meta(meta)
  if n then
    plan.extended = plan.expires > expires
    plan.n, plan.count, plan.expires = n, count, math.max(expires, plan.expires)
  else
    plan.new = true
    plan.n = summary_presize(prefix, start - width)
  end
  plan.n_after = plan.n
  while plan.count + plan.fields > SUMMARY_LOAD * plan.n_after do plan.n_after = plan.n_after + 1 end
  -- (The shards split first: the summaries go where the bucket's shards
  -- after the splits put them, so no shard outgrows its load.)
  -- (summary_shard, written out: split_base once, not per id.)
  local n_after, base, shards = plan.n_after, split_base(plan.n_after), plan.shards
  for i = 1, #ids do
    local h = hashes and hashes[i] or id_hash(ids[i])
    local a = h % (base * 2)
    if a >= n_after then a = h % base end
    shards[i] = a
  end
  if IN_CLUSTER then
    local keys = {prefix .. 'done'}
    for _, s in ipairs(plan.shards) do keys[#keys + 1] = summary_key(prefix, plan.bucket, s) end
    for k = plan.n, plan.n_after - 1 do
      keys[#keys + 1] = summary_key(prefix, plan.bucket, k - split_base(k))
      keys[#keys + 1] = summary_key(prefix, plan.bucket, k)
    end
    for _, key in ipairs(keys) do
      if redis.call('EXISTS', key) == 0 and slot_moving_once(key) then return nil end
    end
  end
  return plan
end

-- Splits shard n - base of a bucket of n shards into it and shard n: the
-- fields whose id hashes to n move, the others stay where they are. Shard
-- n, made here, expires at `expires` (ms, as text) like its bucket.
local function summary_split(prefix, bucket, n, expires)
  local base = split_base(n)
  local src = summary_key(prefix, bucket, n - base)
  local all = redis.call('HGETALL', src)
  local move, names = {}, {}
  for i = 1, #all, 2 do
    local owner = all[i]
    -- A continuation field `#<k><id>` goes where its id goes.
    if string.byte(owner, 1) == 35 then owner = string.sub(owner, 3) end
    if id_hash(owner) % (base * 2) == n then
      names[#names + 1] = all[i]
      move[#move + 1] = all[i]
      move[#move + 1] = all[i + 1]
    end
  end
  -- (A shard the split empties keeps its mark, which no id hashes away;
  -- one made before marks goes, and its next write makes it again. Buckets
  -- written before presizing may hold a placeholder field, an empty value
  -- no reader takes for a summary.)
  if #names > 0 then
    local dst = summary_key(prefix, bucket, n)
    redis.call('HDEL', src, unpack(names))
    move[#move + 1] = SUMMARY_MARK
    move[#move + 1] = ''
    redis.call('HSET', dst, unpack(move))
    redis.call('PEXPIREAT', dst, expires, 'NX')
  end
end

-- Writes summaries `values[i]` of `ids[i]` (each from summary_pieces) as
-- `plan` (from summaries_plan) laid out, once it has split shards until
-- the bucket will be within its load.
local function summaries_write(prefix, plan, ids, values, now)
  local meta = prefix .. 'done'
  if plan.new then
    -- A new bucket: forget the ones that have expired.
    local all = redis.call('HGETALL', meta)
    for i = 1, #all, 2 do
      local _, _, expires = summary_bucket_meta(all[i + 1])
      if not expires or expires <= now then redis.call('HDEL', meta, all[i]) end
    end
  end
  local expires = string.format('%d', plan.expires)
  for n = plan.n, plan.n_after - 1 do summary_split(prefix, plan.bucket, n, expires) end
  -- One HSET per shard, at its first job, with the others of its shard
  -- behind it (`more`, by the first's index). A large bucket's shards
  -- mostly get one job per call: those make no table of their own.
  local first, more = {}, nil
  for i = 1, #ids do
    local s = plan.shards[i]
    local f = first[s]
    if not f then
      first[s] = i
    else
      more = more or {}
      local behind = more[f] or {}
      behind[#behind + 1] = i
      more[f] = behind
    end
  end
  local args = {}
  for i = 1, #ids do
    local s = plan.shards[i]
    if first[s] == i then
      local n = summary_args(args, 0, ids[i], values[i])
      local behind = more and more[i]
      if behind then
        for m = 1, #behind do n = summary_args(args, n, ids[behind[m]], values[behind[m]]) end
      end
      local shard = summary_key(prefix, plan.bucket, s)
      -- The shard's expiry when this write made it: its mark was new too
      -- (or it was made without one, by a split or an older daemon; NX
      -- keeps an expiry it has).
      if redis.call('HSET', shard, SUMMARY_MARK, '', unpack(args, 1, n)) > n / 2 then
        redis.call('PEXPIREAT', shard, expires, 'NX')
      end
    end
  end
  -- Every shard again when a longer retention extends the bucket's expiry.
  if plan.extended then
    for s = 0, plan.n - 1 do redis.call('PEXPIREAT', summary_key(prefix, plan.bucket, s), expires) end
  end
  redis.call('HSET', meta, plan.bucket,
    plan.n_after .. ':' .. (plan.count + plan.fields) .. ':' .. expires)
end

--[[
  Promotion: moves up to about `batch` due jobs of a partition from its due
  sets (`due_key` is the default tenant's) to their ready lists
  (`ready_key` is the default tenant's), after opening the timing wheel's
  (`wheel_key`) buckets whose time has come: at most a batch of their jobs
  move on, to finer buckets or into the due sets. Each due set with jobs
  due gives an equal share of the batch, in due order (at most
  DUE_TENANTS_PER_PROMOTION tenants' sets, the earliest first); what a set
  cannot fill goes to the sets that filled theirs. Answers the jobs moved, the earliest time work is left (the due
  sets' head, or the next bucket to open; at most now while jobs are still
  due or a bucket is still being opened; -1 when there is none), and
  whether a ready list started (it was empty: its tenant's jobs are new to
  the partition's claim loop); nil, having changed nothing, when the
  partition's slot is migrating and a key it needs is not here (the caller
  answers TRYAGAIN). promote_due runs it alone; claim_ready runs it before
  claiming, so that a due job costs its daemon one call to be claimed, and
  says with `index_absent` and `wheel_absent` that it found the tenants'
  due index (no tenant has jobs due here) or the wheel's index (no job is
  due a wheel bucket or more ahead) absent: neither is then read again.
]]
-- (A string: it goes to redis.call as an argument, see horizon_arg below.)
local DUE_TENANTS_PER_PROMOTION = '64'

-- Removes the first `n` members (by rank) of due set `key`.
local function due_drop_first(key, n)
  if n > 0 then redis.call('ZREMRANGEBYRANK', key, '0', int_text(n - 1)) end
end

-- The due sets a promotion reads when a tenant has jobs due (their index
-- `index` says so by `horizon_arg`): the default tenant's set `due_key`
-- first, then each tenant's with jobs due (at most
-- DUE_TENANTS_PER_PROMOTION, the earliest first), each as {key, tenant,
-- members (its due members read, up to `batch` in all), head (its due
-- time after them)}, sharing the batch as said above. Nil when the
-- partition's slot is migrating and a set's key is not here.
local function due_sets_read(due_key, index, horizon_arg, batch)
  -- (Each set's fields made at once: a field added later regrows the table.)
  local sets = {{key = due_key, members = {}, head = false}}
  for _, tenant in ipairs(redis.call('ZRANGE', index, '-inf', horizon_arg, 'BYSCORE', 'LIMIT', '0',
      DUE_TENANTS_PER_PROMOTION)) do
    sets[#sets + 1] = {key = due_key .. ':' .. tenant, tenant = tenant, members = {}, head = false}
  end
  local function take(set, want)
    local got = redis.call('ZRANGE', set.key, '-inf', horizon_arg, 'BYSCORE', 'LIMIT',
      int_text(#set.members), int_text(want))
    for _, member in ipairs(got) do set.members[#set.members + 1] = member end
    return #got
  end
  local left, full = batch, {}
  local share = math.ceil(batch / #sets)
  for round = 1, 2 do
    local takers = sets
    if round == 2 then
      takers = full
      share = math.ceil(left / math.max(#full, 1))
    end
    for _, set in ipairs(takers) do
      local want = math.min(share, left)
      if want > 0 then
        local got = take(set, want)
        left = left - got
        if round == 1 and got == want then full[#full + 1] = set end
      end
    end
    if left == 0 or #full == 0 then break end
  end
  for _, set in ipairs(sets) do
    -- Its head once its due members have left.
    set.head = score_at_rank(set.key, #set.members)
    -- (An empty set may be one whose key has not arrived yet.)
    if set.tenant and #set.members == 0 and not set.head and IN_CLUSTER and slot_moving_once(due_key) then
      return nil
    end
  end
  return sets
end

local function promote_due_jobs(due_key, ready_key, wheel_key, batch, now, horizon, keep, index_absent,
    wheel_absent)
  -- Open the wheel's buckets whose time has come by the horizon (not only by
  -- now: a bucket's jobs must reach the due set before the due set's jobs of
  -- the same millisecond are promoted, or enqueue order is lost). Read pass
  -- first: the bucket lists and records are keys the script builds, checked
  -- by Redis only when touched (see the top of the prelude).
  -- The wheel's head is read once: when nothing opens (the usual case), it
  -- also gives the next wake time below.
  -- (Arguments go as strings: Redis formats a Lua number argument with
  -- %.17g, measured at ~0.23 us per argument against ~0.9 us for the
  -- whole ZRANGE on a warm Redis.)
  local horizon_arg = string.format('%d', horizon)
  -- (Not read when the caller found the wheel absent.)
  local wheel_head = nil
  if not wheel_absent then
    wheel_head = score_at_rank(wheel_key, 0)
  end
  local buckets = EMPTY
  if wheel_head and wheel_head <= horizon then
    buckets = redis.call('ZRANGE', wheel_key, '-inf', horizon_arg, 'BYSCORE', 'LIMIT', '0', '16')
  end
  if #buckets > 0 and IN_CLUSTER and slot_moving(due_key) then return nil end
  -- (Nothing to open, the usual case: no table is made for it.)
  -- (On a single Redis, the namespace's prefix: the records of the jobs
  -- the shared timers hold live in their own partitions.)
  local ns = not IN_CLUSTER and namespace_prefix(timers_prefix(due_key))
  if #buckets > 0 then
    local prefix = timers_prefix(due_key)
    local budget = batch
    local opening = {}
    for _, slot in ipairs(buckets) do
      if budget <= 0 then break end
      local bucket = prefix .. 'wheel:' .. slot
      local ids = redis.call('LRANGE', bucket, 0, budget - 1)
      budget = budget - #ids
      opening[#opening + 1] = {slot, bucket, ids}
    end
    -- Records leaving the wheel, counted by their partition's prefix.
    local to_due, moved_on, left_wheel, homes = due_batch(), wheel_batch(), {}, {}
    for _, o in ipairs(opening) do
      local slot, bucket, ids = o[1], o[2], o[3]
      for _, entry in ipairs(ids) do
        local id, home = wheel_entry_job(ns, entry)
        home = home or prefix
        local at = live(home, id)
        local r = rec_get(at)
        if r and r.state == 'w' then
          -- (By the horizon: never into a bucket that is already due to open.)
          local next_slot, opens = wheel_slot(r.due, horizon)
          if next_slot then
            wheel_batch_add(moved_on, next_slot, opens, entry)
          else
            rec_set_state(at, r, 's', now)
            due_batch_add(to_due, due_key, id, r.due, r.seq, home)
            if not left_wheel[home] then homes[#homes + 1] = home end
            left_wheel[home] = (left_wheel[home] or 0) + 1
          end
        end
      end
      if #ids > 0 then redis.call('LTRIM', bucket, #ids, -1) end
      if redis.call('EXISTS', bucket) == 0 then redis.call('ZREM', wheel_key, slot) end
    end
    wheel_batch_push(prefix, moved_on)
    for _, home in ipairs(homes) do wheel_count(home, -left_wheel[home]) end
    due_batch_push(due_key, to_due)
  end

  -- Due jobs move by id alone: their records are neither read nor written
  -- (a scheduled record whose time has come reads as ready; claim_ready
  -- checks each record, and drops an id whose job is gone). Read pass:
  -- each due set's due members, and its head once they have left.
  -- The tenants' sets' earliest due time: their index's head (not read,
  -- nor its name made, when the caller found the index absent). Only when
  -- it is due are the tenants with jobs due read.
  local index, index_head = nil, nil
  if not index_absent then
    index = due_index(due_key)
    index_head = score_at_rank(index, 0)
  end
  -- The due members, without their scores (a read with scores of the
  -- members after them too cost Redis more in formatting and Lua in
  -- strings than the head's own read after them). Without a tenant's job
  -- due, the default set's alone, in one read and without a table per set
  -- (a steady load's usual case: measured 10,000 instructions less a call
  -- than the tenants' way with one set); else the tenants' sets too (see
  -- due_sets_read).
  -- (On a single Redis, `parts` has each id's partition, by its tag.)
  local ids, head, sets, moved_default
  local parts = ns and {} or EMPTY
  if index_head and index_head <= horizon then
    sets = due_sets_read(due_key, index, horizon_arg, batch)
    if not sets then return nil end
    ids = {}
    for _, set in ipairs(sets) do
      for _, member in ipairs(set.members) do
        ids[#ids + 1] = string.sub(member, DUE_ID_AT)
        if ns then parts[#ids] = due_member_partition(member) end
      end
    end
    head = sets[1].head
  else
    local members = redis.call('ZRANGE', due_key, '-inf', horizon_arg, 'BYSCORE', 'LIMIT', '0',
      int_text(batch))
    moved_default = #members
    ids = {}
    -- (due_member_partition written out: a call a job costs more.)
    for i = 1, moved_default do
      local member = members[i]
      ids[i] = string.sub(member, DUE_ID_AT)
      if ns then parts[i] = tonumber(string.sub(member, 13, 16), 16) end
    end
    head = score_at_rank(due_key, moved_default)
  end
  -- With `keep`, and only the default tenant's jobs moving (its set was
  -- the only one read: a tenant's jobs are due in their own set, see
  -- due_batch_add), up to `keep` of them are handed back to the caller (a
  -- claim, which takes them at once) instead of going through the ready
  -- list; the rest are pushed.
  -- (On a single Redis with `kept_parts` their partitions, and `parts`
  -- those of the ids left.)
  local kept, kept_parts = EMPTY, EMPTY
  if keep > 0 and not sets then
    if #ids <= keep then
      -- (All of them: the list itself, not a copy.)
      kept, ids, kept_parts, parts = ids, EMPTY, parts, EMPTY
    else
      local rest, rest_parts = {}, {}
      kept, kept_parts = {}, {}
      for i, id in ipairs(ids) do
        if i <= keep then
          kept[i], kept_parts[i] = id, parts[i]
        else
          rest[#rest + 1], rest_parts[#rest + 1] = id, parts[i]
        end
      end
      ids, parts = rest, rest_parts
    end
  end
  -- (With buckets opened, the slot was found still above.)
  if #ids > 0 and ready_push_blocked(ready_key, ids) then return nil end
  if sets then
    for _, set in ipairs(sets) do
      due_drop_first(set.key, #set.members)
      if set.tenant and set.head then
        redis.call('ZADD', index, string.format('%d', set.head), set.tenant)
      elseif set.tenant then
        redis.call('ZREM', index, set.tenant)
      end
    end
  else
    due_drop_first(due_key, moved_default)
  end
  -- No wake message: the daemon promoting is the one that claims from this
  -- partition (see src/fleet.rs), and tells its claim loop itself. From
  -- the shared timers each id goes to its own partition's ready list, and
  -- the partitions whose list started are answered (`started_in`), so
  -- that the daemon wakes their claim loops, its own or another's.
  local started, started_in = false, EMPTY
  if #ids > 0 and not ns then
    started = ready_push(ready_key, ids)
  elseif #ids > 0 then
    local own = string.sub(ready_key, 1, -6)
    local by_partition, order = {}, {}
    for i, id in ipairs(ids) do
      local q = parts[i]
      local list = by_partition[q]
      if not list then
        list = {}
        by_partition[q] = list
        order[#order + 1] = q
      end
      list[#list + 1] = id
    end
    started_in = {}
    for _, q in ipairs(order) do
      local home = prefix_of_partition(ns, q)
      if ready_push(home .. 'ready', by_partition[q]) then
        started_in[#started_in + 1] = q
        if home == own then started = true end
      end
    end
  end

  local next_due
  if #buckets > 0 then
    next_due = next_wake(due_key)
  else
    -- The default set's head was read above; the tenants' sets' earliest
    -- is the index's head (read again when a tenant's set moved).
    next_due = head
    local b = index_head
    if sets then b = score_at_rank(index, 0) end
    if b and (not next_due or b < next_due) then next_due = b end
    if not next_due or (wheel_head and wheel_head < next_due) then next_due = wheel_head end
  end
  return #ids + #kept, next_due or -1, started, kept, started_in, kept_parts
end

--[[
  Ordered delivery (SPEC §11.5). The jobs of one ordering key within a
  topic all live in one partition (the store places them by the key; a job
  whose id hashes elsewhere leaves a pointer there, below) and are listed,
  in creation order, in its LIST `<ns>:{p}:order:<topic>:<key>`. Only the
  list's head is ever scheduled, ready or in flight: the others wait as
  records in state `o` (held), in none of the partition's sets, their due
  time in their record. The step that finishes the head (delivered,
  dead-lettered or cancelled) pops it and, in the same atomic step,
  releases the next: due at its own time or now, whichever is later, into
  the due set, the wheel or the ready list like any job. The stats hash's
  `held` field counts held records.

  Steps that know the job's ordering list from the daemon take it as an
  argument (`<topic>:<key>`, "" for none), so an unordered job costs them
  nothing; the others read it from the spec (spec_order).

  Ordering keys are per tenant (SPEC §15): the list's LIST key names the
  job's line, order_line(id, list): the list itself for a job of the
  default tenant (a bare id), `<tenant>/<topic>:<key>` for a job whose
  internal id is `<tenant>/<id>`. src/tenant.rs (order_line) has the
  same rule.
]]

-- The ordering line of job `id` (an internal id) for its ordering list
-- `order` (`<topic>:<key>`): `order` in the default tenant, else
-- `<tenant>/<order>`.
local function order_line(id, order)
  local slash = string.find(id, '/', 1, true)
  if not slash then return order end
  return string.sub(id, 1, slash) .. order
end

-- The ordering line (see order_line) of job `id` with spec JSON `spec`,
-- or nil when it has no ordering key.
local function spec_order(spec, id)
  -- A quick look first: most jobs have no ordering key.
  if not string.find(spec, '"ordering_key"', 1, true) then return nil end
  local ok, s = pcall(cjson.decode, spec)
  if ok and type(s) == 'table' and type(s.ordering_key) == 'string' then
    local topic = 'default'
    if type(s.topic) == 'string' then topic = s.topic end
    return order_line(id, topic .. ':' .. s.ordering_key)
  end
  return nil
end

-- The read pass of taking job `id` off ordering line `order` of the
-- partition with key prefix `prefix` (see order_leave): answers nil,
-- having read only, when the partition's slot is moving (some of the keys
-- order_leave touches may then be elsewhere: the caller answers
-- TRYAGAIN); else the list's key and head.
local function order_plan(prefix, order)
  if IN_CLUSTER and slot_moving_once(prefix .. 'due') then return nil end
  local key = prefix .. 'order:' .. order
  return {key = key, head = redis.call('LINDEX', key, 0)}
end

-- Takes job `id` off its ordering list (read by order_plan) and, when it
-- was the head, releases the job behind it; `channel` and `p` name the
-- partition's wake channel. Returns the released job's id, or nil.
local function order_leave(prefix, plan, id, now, channel, p)
  if plan.head ~= id then
    -- A held job (cancelled): it leaves its place in the line.
    redis.call('LREM', plan.key, 1, id)
    return nil
  end
  redis.call('LPOP', plan.key)
  -- The next id is released; one whose job is gone (which no step leaves
  -- behind, but a hand-edited record may) is dropped, so that it cannot
  -- block the line.
  for _ = 1, 16 do
    local next_id = redis.call('LINDEX', plan.key, 0)
    if not next_id then return nil end
    local at = live(prefix, next_id)
    local r = rec_get(at)
    if r and r.state == 'o' then
      redis.call('HINCRBY', prefix .. 'stats', 'held', -1)
      r.ut = now
      if r.due <= now then
        r.state, r.due, r.seq = 'r', now, 0
        rec_put(at, r)
        if ready_push(prefix .. 'ready', {next_id}) then wake_ready(channel, p) end
        return next_id
      end
      local due_key = due_key_of(prefix)
      local before = next_wake(due_key)
      r.seq = redis.call('INCR', prefix .. 'seq')
      local wake = schedule(prefix, due_key, next_id, r, now)
      if r.state == 'w' then wheel_count(prefix, 1) end
      if wake and (not before or wake < before) then wake_due(channel, p, wake) end
      return next_id
    end
    if r and STATE_NAMES[r.state] and not (r.state == 'd' or r.state == 'x' or r.state == 'c') then
      return nil -- already on its way
    end
    redis.call('LPOP', plan.key)
  end
  return nil
end

--[[
  Placement pointers. A job placed in another partition than its id's (an
  ordered job lives where its ordering key does) leaves, in its id's
  partition, a pointer in place of a live record: the field of the live
  record hashes holds `@<partition>`, shorter than any record, so that a
  lookup or a create by id alone finds where the job is. The partition's
  ZSET `<ns>:{p}:placed` lists its pointers, scored by when to check that
  the job still exists there (the daemon drops the pointers of jobs gone).
]]


-- A schedule's `meta` field (see put_schedule.lua) as a table, or nil.
local function schedule_meta(text)
  if not text then return nil end
  local ver, max, lease, overlap, paused, anchor, ct, ut, order = string.match(text,
    '^(%d+) (%d+) (%d+) (%a+) ([01]) (%-?%d+) (%d+) (%d+) ?(.*)$')
  if not ver then return nil end
  return {ver = tonumber(ver), max = tonumber(max), lease = tonumber(lease), overlap = overlap,
    paused = paused == '1', anchor = tonumber(anchor), ct = tonumber(ct), ut = tonumber(ut),
    order = order}
end

--[[
  The ledger (SPEC §15). The partition's HASH `<ns>:{p}:ledger` counts, per
  tenant, its jobs `created`, `replayed`, `delivered`, `dead_lettered` and
  `cancelled` (fields `<tenant>:<counter>`), each counted by the script that
  makes the change, in the same atomic step, a batch's jobs grouped per
  tenant (one HINCRBY per tenant and counter). A tenant's live jobs are
  created + replayed - delivered - dead_lettered - cancelled, summed over
  the partitions. Its field `~seeded` (no tenant has a `~`) says that the
  jobs live before the ledger existed have been counted (seed_ledger).
]]

-- The tenant of internal job id `id` (src/tenant.rs): the part before its
-- first `/`, or 'default' when it has none.
local function id_tenant(id)
  local slash = string.find(id, '/', 1, true)
  if slash then return string.sub(id, 1, slash - 1) end
  return 'default'
end

-- A tally of jobs per tenant, in the order their tenants were first seen.
local function ledger_tally()
  return {order = {}, n = {}}
end

-- Counts job `id` in tally `t`.
local function ledger_count(t, id)
  local tenant = id_tenant(id)
  local n = t.n[tenant]
  if not n then
    n = 0
    t.order[#t.order + 1] = tenant
  end
  t.n[tenant] = n + 1
end

-- Counts the jobs of `ids` in tally `t` (ledger_count's, written out
-- for a call's many jobs).
local function ledger_count_all(t, ids)
  local counts, order = t.n, t.order
  for i = 1, #ids do
    local id = ids[i]
    local slash = string.find(id, '/', 1, true)
    local tenant = slash and string.sub(id, 1, slash - 1) or 'default'
    local n = counts[tenant]
    if not n then
      n = 0
      order[#order + 1] = tenant
    end
    counts[tenant] = n + 1
  end
end

-- Adds tally `t` to counter `what` of the ledger of the partition with key
-- prefix `prefix`: one HINCRBY per tenant.
local function ledger_add(prefix, what, t)
  for _, tenant in ipairs(t.order) do
    redis.call('HINCRBY', prefix .. 'ledger', tenant .. ':' .. what, int_text(t.n[tenant]))
  end
end

-- Counts one job `id` under counter `what` (see ledger_add).
local function ledger_one(prefix, what, id)
  redis.call('HINCRBY', prefix .. 'ledger', id_tenant(id) .. ':' .. what, '1')
end

-- The read-pass guard of a script that will count in the ledger (see the
-- top of this prelude): false when the ledger hash is absent because the
-- partition's slot is moving (the caller gives up, unchanged). Every
-- partition's ledger exists once a daemon has started (seed_ledger marks
-- it), so in a cluster this costs one EXISTS, outside none.
local function ledger_here(prefix)
  if not IN_CLUSTER then return true end
  return redis.call('EXISTS', prefix .. 'ledger') == 1 or not slot_moving_once(prefix .. 'ledger')
end

--[[
  The fair share of a claim between tenants' ready lists (claim_ready; SPEC
  §15), defined once with the library rather than on every claim.
]]

-- Most tenants' lists one claim looks at (see claim_ready's header).
local TENANTS_PER_CLAIM = 64

-- The weight of `tenant` by a claim's arguments `args` (claim_ready's
-- ARGV[6], or its own in the pairs that follow).
local function weight_of(args, tenant)
  for i = 7, #args - 1, 2 do
    if args[i] == tenant then return arg_number(args[i + 1]) end
  end
  return arg_number(args[6])
end

-- Jobs `a..b` of a cycle cover of `[lo, hi)`.
local function overlap(a, b, lo, hi)
  return math.max(0, math.min(b, hi) - math.max(a, lo))
end

-- Takes the ids a claim (its arguments `args`, for the weights) takes
-- from the default list `ready_key` and those of `tenants`, `want` shared
-- by weight: a list per entry, {key, tenant (nil for default), ids, dry
-- (it gave all it had)}. The lists with jobs make a cycle of sum(weight)
-- places, each list as many places as its weight (default first, then the
-- tenants by name); a claim takes the next `want` places of the cycle from
-- the partition's turn (`turn_key`, moved on by `want`), so small claims
-- share by weight too; what a list cannot fill goes round to the others.
-- Nil when a tenant's list is absent while the slot moves.
local function share_lists(args, ready_key, turn_key, tenants, want)
  table.sort(tenants)
  local lists, W = {}, 0
  local function add(key, tenant)
    local len = redis.call('LLEN', key)
    if len > 0 then
      local w = weight_of(args, tenant or 'default')
      lists[#lists + 1] = {key = key, tenant = tenant, len = len, lo = W, hi = W + w, take = 0}
      W = W + w
    elseif tenant then
      if IN_CLUSTER and slot_moving_once(key) then return false end
      redis.call('SREM', partition_prefix(ready_key, 'ready') .. 'tenants', tenant)
    end
    return true
  end
  if not add(ready_key, nil) then return nil end
  for _, t in ipairs(tenants) do
    if not add(ready_key .. ':' .. t, t) then return nil end
  end
  if #lists <= 1 then
    local l = lists[1]
    if l then l.take = math.min(want, l.len) end
  else
    local s = (redis.call('INCRBY', turn_key, want) - want) % W
    local full, r = math.floor(want / W), want % W
    local left = want
    for _, l in ipairs(lists) do
      local n = full * (l.hi - l.lo)
      if s + r <= W then
        n = n + overlap(s, s + r, l.lo, l.hi)
      else
        n = n + overlap(s, W, l.lo, l.hi) + overlap(0, s + r - W, l.lo, l.hi)
      end
      l.take = math.min(n, l.len)
      left = left - l.take
    end
    -- What a list could not fill goes round, from the turn's list on.
    while left > 0 do
      local gave = false
      for _, l in ipairs(lists) do
        if left > 0 and l.take < l.len then
          l.take, left, gave = l.take + 1, left - 1, true
        end
      end
      if not gave then break end
    end
  end
  for _, l in ipairs(lists) do
    l.ids = l.take > 0 and redis.call('LRANGE', l.key, 0, l.take - 1) or {}
    l.dry = l.take >= l.len
  end
  return lists
end
