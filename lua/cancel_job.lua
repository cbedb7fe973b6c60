--[[
  Cancel a job that has not finished. A scheduled job leaves the due set; a job
  in flight leaves the in-flight set (its attempt's outcome will be discarded
  as stale, so it is not retried); a ready job's id stays in the ready list as
  a tombstone that claim_ready skips (no LREM on a long list).

  Input:
    KEYS[1] job record      <ns>:{p}:job:<id>
    KEYS[2] due zset        <ns>:{p}:due
    KEYS[3] inflight zset   <ns>:{p}:inflight
    KEYS[4] history list    <ns>:{p}:hist:<id>
    ARGV[1] id
    ARGV[2] retention in ms
    ARGV[3] wake channel (a leased job's cancel is announced as x<id>, so a
            daemon holding it for its host drops it before its attempt)
  Output:
     1 cancelled now
     0 was already cancelled (nothing changed)
    -1 no such job
    -2 already delivered or dead (nothing changed)
]]
local rcall = redis.call
local r = rec_header(KEYS[1])
if not r then return -1 end
local state = r.state
if state == 'c' then return 0 end
if state == 'd' or state == 'x' then return -2 end

if state == 's' and r.seq > 0 then
  rcall('ZREM', KEYS[2], due_member(r.seq, ARGV[1]))
elseif state == 'w' then
  -- Its id stays in its wheel bucket as a tombstone (see the prelude).
  wheel_count(partition_prefix(KEYS[2], 'due'), -1)
elseif state == 'i' then
  rcall('ZREM', KEYS[3], ARGV[1])
  rcall('PUBLISH', ARGV[3], 'x' .. ARGV[1])
end
-- A parked job's parking entry is skipped when its host drains (its
-- sequence no longer matches).
r.state, r.seq, r.ut = 'c', 0, now_ms()
rec_put(KEYS[1], r)
rcall('PEXPIRE', KEYS[1], ARGV[2])
rcall('PEXPIRE', KEYS[4], ARGV[2])
return 1
