--[[
  Replay one dead letter: the job becomes live again (ready, due now, a fresh
  ladder) and its dead-letter entry is deleted, in this one atomic step, so a
  crash can neither lose the job nor leave it both live and dead-lettered.
  A job that is live already (replayed before, or re-created) is not revived
  twice: its stale entry is only deleted. A job with an ordering key joins
  the tail of its ordering list, held unless the list is empty (see the
  prelude).

  Input:
    KEYS[1] kept record      <ns>:{p}:job:<id>  (the dead job's; deleted on
            revival, the live record going to <ns>:{p}:jobs:<shard>)
    KEYS[2] ready list      <ns>:{p}:ready
    KEYS[3] dead stream     <ns>:{p}:dead
    KEYS[4] history list    <ns>:{p}:hist:<id>
    KEYS[5] dead-letter index <ns>:{p}:dead:ids
    ARGV[1] id
    ARGV[2] dead-letter entry id
    ARGV[3] job spec JSON to revive (the entry's `job`, maybe with a new url)
    ARGV[4] max attempts (rungs + 1)
    ARGV[5] wake channel
    ARGV[6] partition number
    ARGV[7] its ordering list `<topic>:<ordering key>`, or "" for none
            (the script takes its tenant's line, see order_line)
  Keys built here (same hash tag): the live record hash, ordering lists,
  the stats hash and the ledger `<ns>:{p}:ledger` (counting the replay
  under the job's tenant).
  Output:
    DONE        revived
    UNCHANGED   the job was live already; the stale entry was deleted
    NOT_FOUND   no such dead-letter entry (nothing changed)
    (the codes of the prelude)
]]
local rcall = redis.call
local entry = rcall('XRANGE', KEYS[3], ARGV[2], ARGV[2])
if #entry == 0 then return NOT_FOUND end

local prefix = partition_prefix(KEYS[2], 'ready')
local at = live(prefix, ARGV[1])
local r = rec_get(at)
if r and (r.state == 's' or r.state == 'w' or r.state == 'p' or r.state == 'r' or r.state == 'i' or r.state == 'o') then
  dead_forget(KEYS[3], KEYS[5], ARGV[1], ARGV[2])
  return UNCHANGED
end

local now = now_ms()
local created = now
local dead = rec_get({k = KEYS[1]})
if dead then created = dead.ct end
if not ledger_here(prefix) then return try_again() end
local state = 'r'
if ARGV[7] ~= '' then
  local line = order_plan(prefix, order_line(ARGV[1], ARGV[7]))
  if not line then return try_again() end
  if line.head then state = 'o' end
end
if state == 'r' and ready_push_blocked(KEYS[2], {ARGV[1]}) then return try_again() end
rec_create(at, {state = state, ut = now, att = 0, max = tonumber(ARGV[4]), due = now,
  seq = 0, ct = created, lease = 0, given = GIVEN_NEITHER}, ARGV[3])
rcall('DEL', KEYS[1])
rcall('PERSIST', KEYS[4])
if ARGV[7] ~= '' then rcall('RPUSH', prefix .. 'order:' .. order_line(ARGV[1], ARGV[7]), ARGV[1]) end
if state == 'o' then
  rcall('HINCRBY', prefix .. 'stats', 'held', 1)
elseif ready_push(KEYS[2], {ARGV[1]}) then
  wake_ready(ARGV[5], ARGV[6])
end
dead_forget(KEYS[3], KEYS[5], ARGV[1], ARGV[2])
ledger_one(prefix, 'replayed', ARGV[1])
return DONE
