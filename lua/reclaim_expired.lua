--[[
  Take back attempts whose lease expired (the daemon running them died or
  hung): each job becomes ready again at once, or is dead-lettered when the
  lost attempt was its last allowed one (a job with an ordering key then
  leaves its ordering list, releasing the job behind it, see the prelude).
  The lost attempt counts (the record's counter becomes its number), and
  its lease is gone, so its late outcome fails its fencing check.
  Round leases (see the prelude) whose deadline passed are materialized
  first (by the partitions owning a round space: each in a cluster,
  partition 0 on a single Redis), so their jobs are taken back as any:
  this partition's in this call, another's by its own call, which the
  answer asks for.

  Input:
    KEYS[1] inflight zset   <ns>:{p}:inflight
    KEYS[2] ready list      <ns>:{p}:ready
    KEYS[3] dead stream     <ns>:{p}:dead
    KEYS[4] stats hash      <ns>:{p}:stats
    KEYS[5] dead-letter index <ns>:{p}:dead:ids
    ARGV[1] batch size
    ARGV[2] job key prefix      <ns>:{p}:job:   (same hash tag; live record
            hashes, a dead job's kept record and the ledger
            `<ns>:{p}:ledger`, counting dead-lettered jobs per tenant, are
            built from it)
    ARGV[3] history key prefix  <ns>:{p}:hist:  (same hash tag)
    ARGV[4] retention in ms
    ARGV[5] dead-letter stream cap
    ARGV[6] wake channel
    ARGV[7] partition number
  Output:
    {reclaimed, dead_lettered, next_deadline, now, materialized_in}:
    next_deadline is the earliest lease left in the set (or round, for a
    partition owning a round space), or -1 when there is none;
    `materialized_in` the other partitions whose jobs got leases of their
    own from expired rounds (their leases have expired: take them back).
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local rcall = redis.call
local now = now_ms()
local prefix = partition_prefix(ARGV[2], 'job:')

-- Expired rounds, materialized (a change of its own: it stands whatever
-- follows).
local space = (IN_CLUSTER or ARGV[7] == '0') and round_space(prefix)
local materialized_in = {}
if space then
  local expired = rcall('ZRANGE', space .. 'rounds', '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
  local leased_in = {}
  for _, token in ipairs(expired) do
    round_materialize(space, token, leased_in)
  end
  local own = tonumber(ARGV[7])
  for q in pairs(leased_in) do
    if q ~= own then materialized_in[#materialized_in + 1] = q end
  end
  table.sort(materialized_in)
end

local ids = rcall('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
-- Read pass: every key to be written, before the first write (see the
-- prelude). A history list may rightly be absent (a first attempt).
local records, lines = {}, {}
for i, id in ipairs(ids) do
  local r = rec_get(live(prefix, id))
  if IN_CLUSTER and (not r or rcall('EXISTS', ARGV[3] .. id) == 0)
    and slot_moving_once(KEYS[1]) then
    return try_again()
  end
  -- (Every id here has a lease: its record, scheduled or ready, is in
  -- flight; see the prelude. A claim takes a scheduled job only when it
  -- is due within the claim ahead, long before its lease ends: a lease
  -- of one due later was left by hand, and the job waits for its time.)
  if r and rec_may_fly(r) and (r.state ~= 's' or r.due <= now) then
    r.att = rec_flight_attempt(r)
  else
    r = nil
  end
  records[i] = r or false
  if r and r.att < r.max and ready_push_blocked(KEYS[2], {id}) then
    return try_again()
  end
  local order = r and r.att >= r.max and spec_order(r.spec, id)
  if order then
    lines[i] = order_plan(prefix, order)
    if not lines[i] then return try_again() end
  end
end

if #ids > 0 and not ledger_here(prefix) then return try_again() end
local lost = 'the attempt lease expired before an outcome was recorded'
local requeued, dead = 0, 0
local tally = ledger_tally()
for i, id in ipairs(ids) do
  local r = records[i]
  if r then
    history_push(ARGV[3] .. id, cjson.encode({at = now, error = 'lease_expired', message = lost}))
    if r.att >= r.max then
      local entry = dead_letter(KEYS[3], KEYS[5], ARGV[5], id, spec_topic(r.spec), r.att,
        'lease_expired: ' .. lost, '', r.spec, now, r.given)
      rec_set_dead(r, entry, now)
      rec_keep(prefix, id, r, ARGV[4])
      rcall('PEXPIRE', ARGV[3] .. id, ARGV[4])
      if lines[i] then order_leave(prefix, lines[i], id, now, ARGV[6], ARGV[7]) end
      dead = dead + 1
      ledger_count(tally, id)
    else
      rec_set_state(live(prefix, id), r, 'r', now)
      if ready_push(KEYS[2], {id}) then wake_ready(ARGV[6], ARGV[7]) end
      requeued = requeued + 1
    end
  end
end
if #ids > 0 then rcall('ZREM', KEYS[1], unpack(ids)) end
if requeued + dead > 0 then
  rcall('HINCRBY', KEYS[4], 'expired_leases', requeued + dead)
  if dead > 0 then rcall('HINCRBY', KEYS[4], 'dead_lettered', dead) end
  ledger_add(prefix, 'dead_lettered', tally)
end

local next_deadline = -1
local head = rcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if head[2] then next_deadline = tonumber(head[2]) end
if space then
  head = rcall('ZRANGE', space .. 'rounds', 0, 0, 'WITHSCORES')
  if head[2] and (next_deadline < 0 or tonumber(head[2]) < next_deadline) then
    next_deadline = tonumber(head[2])
  end
end
return {requeued, dead, next_deadline, now, materialized_in}
