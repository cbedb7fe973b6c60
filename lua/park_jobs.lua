--[[
  Hold claimed jobs for their host while it is open (circuit breaker) or
  paused: each leaves the in-flight set and waits in the host's parking of
  this partition, scored by its due time, costing nothing until the host
  closes and the parking is drained (unpark_jobs). The attempt counter stays
  at the attempts made before (a layout-3 record's goes back down): no
  attempt was made. A parked job reads as `scheduled`, with
  no due-set member and its own parking sequence (the member's prefix); cancel and PATCH
  work on it as on any scheduled job. Stale leases are skipped.

  Input:
    KEYS[1] inflight zset     <ns>:{p}:inflight
            (a job of a live round lease is found in the round space and
            its round materialized first: see "Round leases" in the prelude)
    KEYS[2] parking zset      <ns>:{p}:park:<host>
    KEYS[3] parked-hosts set  <ns>:{p}:parked
    KEYS[4] sequence          <ns>:{p}:seq
    ARGV[1] job key prefix    <ns>:{p}:job:  (the live record hashes are built from it)
    ARGV[2] host              scheme://host:port
    ARGV[3] id, ARGV[4] fencing token (the attempt the lease was granted
    for); repeated per job
  Output:
    the number of jobs parked
]]
local rcall = redis.call
local now = now_ms()

-- Read pass: every job record before the first write (see the prelude).
local prefix = partition_prefix(ARGV[1], 'job:')
local records = {}
for i = 3, #ARGV, 2 do
  local r = rec_get(live(prefix, ARGV[i]))
  if not r and slot_moving_once(KEYS[1]) then return try_again() end
  records[i] = r or false
end

local parked = 0
for i = 3, #ARGV, 2 do
  local id, token = ARGV[i], tonumber(ARGV[i + 1])
  local r = records[i]
  if r and rec_in_flight(r, KEYS[1], id) and rec_flight_attempt(r) == token then
    local seq = rcall('INCR', KEYS[4])
    rcall('ZREM', KEYS[1], id)
    r.state, r.att, r.seq, r.ut = 'p', token - 1, seq, now
    rec_put(live(prefix, id), r)
    rcall('ZADD', KEYS[2], string.format('%d', r.due), due_member(seq, id, ''))
    parked = parked + 1
  end
end
if parked > 0 then rcall('SADD', KEYS[3], ARGV[2]) end
return parked
