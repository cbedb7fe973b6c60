--[[
  Cancel a job that has not finished. A scheduled job leaves its due set; a job
  in flight leaves the in-flight set (its attempt's outcome will be discarded
  as stale, so it is not retried); a ready job's id stays in the ready list as
  a tombstone that claim_ready skips (no LREM on a long list). A job with an
  ordering key leaves its ordering list: a held one its place in the line,
  the head releasing the job behind it (see the prelude).

  By default the record and history are then deleted and a summary remains
  (see the prelude), keeping the attempts of the history list in compact
  form; with `retention.keep_bodies` the record moves, marked
  cancelled, to its kept key, and it and its history expire after the
  retention period.

  Input:
    KEYS[1] record hash     <ns>:{p}:jobs:<shard>  (the job's live record; a
            finished one is looked for at <ns>:{p}:job:<id> and in the summaries)
    KEYS[2] due zset        <ns>:{p}:due  (the default tenant's; see the
            prelude for the other tenants')
    KEYS[3] inflight zset   <ns>:{p}:inflight
            (a job of a live round lease is found in the round space and
            its round materialized first: see "Round leases" in the prelude)
    KEYS[4] history list    <ns>:{p}:hist:<id>
    ARGV[1] id
    ARGV[2] retention in ms
    ARGV[3] wake channel (a leased job's cancel is announced as x<id>, so a
            daemon holding it for its host drops it before its attempt)
    ARGV[4] "keep" to keep the record (keep_bodies), "summary" to summarise
    ARGV[5] the content digest of the spec the caller read (for the summary)
    ARGV[6] the SHA-1 (hex) of that spec JSON: the digest is the record's
            only while the stored spec is still this one
    ARGV[7] partition number
  Keys built here (same hash tag): the kept record, summaries, the stats
  hash, ordering lists and the ledger `<ns>:{p}:ledger` (counting the
  cancel under the job's tenant).
  Output:
    DONE         cancelled now, before any worker had it: no attempt of it
                 will ever be sent (the partition's `stats` hash counts it
                 under `cancelled`)
    IN_FLIGHT    cancelled now (counted the same), but it was already
                 claimed (held in a daemon or in flight): that attempt may
                 still be sent, its outcome is discarded, none follows it
    UNCHANGED    was already cancelled
    NOT_FOUND    no such job
    WRONG_STATE  already delivered or dead (nothing changed)
    CHANGED      the spec changed since the caller read it (nothing changed;
                 read again and retry)
    (the codes of the prelude)
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local rcall = redis.call
local prefix = partition_prefix(KEYS[3], 'inflight')
local at = {h = KEYS[1], id = ARGV[1]}
local r = rec_get(at)
local now = now_ms()
if not r then
  -- A finished job: kept whole, or summarised.
  r = rec_get(kept(prefix, ARGV[1]))
  if not r then
    local summary = summary_find(prefix, ARGV[1], now)
    if summary and summary.state == 'c' then return UNCHANGED end
    if summary then return WRONG_STATE end
    if slot_moving_once(KEYS[1]) then return try_again() end
    return NOT_FOUND
  end
end
local state = r.state
if state == 'c' then return UNCHANGED end
if state == 'd' or state == 'x' then return WRONG_STATE end
-- In flight (claimed: held in a daemon or attempted; see the prelude): its
-- attempt counts in its summary.
local flying = rec_in_flight(r, KEYS[3], ARGV[1])
if flying then r.att = rec_flight_attempt(r) end

local keep = ARGV[4] == 'keep'
local plan, summary = nil, nil
if not keep then
  if redis.sha1hex(r.spec) ~= ARGV[6] then return CHANGED end
  -- The newest attempt record is the summary's last attempt; the others
  -- its earlier ones (the attempt in flight, if any, has none yet).
  local hist = rcall('LRANGE', KEYS[4], 0, -1)
  summary = summary_pieces(summary_of('c', r.att, r.max, r.ct, now, summary_tail(r.spec, ARGV[5], hist[1])),
    summary_entries(hist, 2, now), flying and #hist > 0)
  plan = summaries_plan(prefix, {ARGV[1]}, now, tonumber(ARGV[2]), summary_field_count(summary))
  if not plan then return try_again() end
end
if not ledger_here(prefix) then return try_again() end
local order = spec_order(r.spec, ARGV[1])
local line = nil
if order then
  line = order_plan(prefix, order)
  if not line then return try_again() end
end
if state == 's' and r.seq > 0 and due_blocked(KEYS[2], {ARGV[1]}) then return try_again() end

if flying then
  rcall('ZREM', KEYS[3], ARGV[1])
  rcall('PUBLISH', ARGV[3], 'x' .. ARGV[1])
end
-- (A claimed job has left its due set already: its member is not there.)
if state == 's' and r.seq > 0 then
  due_remove(KEYS[2], ARGV[1], r.seq, prefix)
elseif state == 'w' then
  -- Its id stays in its wheel bucket as a tombstone (see the prelude).
  wheel_count(prefix, -1)
elseif state == 'o' then
  rcall('HINCRBY', prefix .. 'stats', 'held', -1)
end
-- A parked job's parking entry is skipped when its host drains (its
-- sequence no longer matches); so is a ready job's tombstone, whose record
-- is gone or no longer live.
if keep then
  r.state, r.seq, r.ut = 'c', 0, now
  rec_keep(prefix, ARGV[1], r, ARGV[2])
  rcall('PEXPIRE', KEYS[4], ARGV[2])
else
  rec_delete(at)
  rcall('DEL', KEYS[4])
  summaries_write(prefix, plan, {ARGV[1]}, {summary}, now)
end
if line then order_leave(prefix, line, ARGV[1], now, ARGV[3], ARGV[7]) end
rcall('HINCRBY', prefix .. 'stats', 'cancelled', 1)
ledger_one(prefix, 'cancelled', ARGV[1])
if flying then return IN_FLIGHT end
return DONE
