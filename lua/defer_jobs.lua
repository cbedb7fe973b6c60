--[[
  Give claimed jobs back without attempting them (their host has more work
  waiting than this daemon should hold): each leaves the in-flight set and is
  scheduled again after its own delay, in its tenant's due set. The attempt counter stays
  at the attempts made before (a layout-3 record's goes back down), since
  no attempt was made; these claims produced no outcome, so their tokens
  are never used. A job whose lease was taken over or that was
  cancelled meanwhile is left alone.

  Input:
    KEYS[1] inflight zset   <ns>:{p}:inflight
            (a job of a live round lease is found in the round space and
            its round materialized first: see "Round leases" in the prelude)
    KEYS[2] due zset        <ns>:{p}:due  (the default tenant's; see the
            prelude for the other tenants' and their index)
    KEYS[3] sequence        <ns>:{p}:seq
    ARGV[1] job key prefix  <ns>:{p}:job:  (the live record hashes are built from it)
    ARGV[2] wake channel
    ARGV[3] partition number
    ARGV[4] id, ARGV[5] fencing token (the attempt number the lease was
    granted for), ARGV[6] delay in ms; repeated per job
  Output:
    the number of jobs given back
]]
local rcall = redis.call
local now = now_ms()

-- Read pass: every job record before the first write (see the prelude).
local prefix = partition_prefix(ARGV[1], 'job:')
local records, ids = {}, {}
for i = 4, #ARGV, 3 do
  local r = rec_get(live(prefix, ARGV[i]))
  if not r and slot_moving_once(KEYS[1]) then return try_again() end
  records[i] = r or false
  ids[#ids + 1] = ARGV[i]
end
-- The tenants' due sets (and their index) they may join.
if due_blocked(KEYS[2], ids) then return try_again() end

local head = due_head(KEYS[2])
local earliest = head
local to_due = due_batch()
local given = 0
for i = 4, #ARGV, 3 do
  local id, token = ARGV[i], tonumber(ARGV[i + 1])
  local r = records[i]
  if r and rec_in_flight(r, KEYS[1], id) and rec_flight_attempt(r) == token then
    local due = now + tonumber(ARGV[i + 2])
    local seq = rcall('INCR', KEYS[3])
    rcall('ZREM', KEYS[1], id)
    r.state, r.att, r.due, r.seq, r.ut = 's', token - 1, due, seq, now
    rec_put(live(prefix, id), r)
    due_batch_add(to_due, KEYS[2], id, due, seq, prefix)
    if not earliest or due < earliest then earliest = due end
    given = given + 1
  end
end
due_batch_push(KEYS[2], to_due)
if given > 0 and (not head or earliest < head) then
  wake_due(ARGV[2], ARGV[3], earliest)
end
return given
