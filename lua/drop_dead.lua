--[[
  Drop one dead letter for good: its stream entry and the index's pointer
  to it, in one step.

  Input:
    KEYS[1] dead stream       <ns>:{p}:dead
    KEYS[2] dead-letter index <ns>:{p}:dead:ids
    ARGV[1] id
    ARGV[2] dead-letter entry id
  Output:
    DONE        dropped
    NOT_FOUND   no such entry (a stale pointer to it is removed)
    (the codes of the prelude)
]]
local found = #redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2]) > 0
dead_forget(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if found then return DONE end
return NOT_FOUND
