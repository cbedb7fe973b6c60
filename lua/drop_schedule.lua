--[[
  Delete a schedule (the jobs it fired stay).

  Input:
    KEYS[1] fire index      <ns>:{p}:fires
    KEYS[2] schedule index  <ns>:{p}:schedules
    KEYS[3] the schedule    <ns>:{p}:sched:<id>
    ARGV[1] id
  Output:
    DONE deleted, NOT_FOUND no such schedule (the codes of the prelude)
]]
if redis.call('HEXISTS', KEYS[3], 'meta') == 0 then return NOT_FOUND end
redis.call('DEL', KEYS[3])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return DONE
