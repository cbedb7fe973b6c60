--[[
  Place a schedule whose jobs have an ordering key: it lives in its key's
  partition (where its fired jobs must be, beside their ordering list), and
  its id's partition keeps a stub, the hash `<ns>:{p}:sched:<id>` holding
  only `at` = the partition it lives in, so that it is found by id. Run in
  the id's partition before the schedule is created there; an id whose
  schedule already lives here, or whose stub names another partition,
  keeps its place (the caller then compares with the schedule where it is).

  Input:
    KEYS[1] the schedule    <ns>:{p}:sched:<id>
    ARGV[1] this partition's number
    ARGV[2] the partition it should live in
    ARGV[3] "" or a partition number: a stub naming that partition is
            replaced (its schedule was found gone there)
  Output:
    the partition where it lives or is to be created
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local f = redis.call('HMGET', KEYS[1], 'spec', 'at')
local here = tonumber(ARGV[1])
if f[1] then return here end
local at = tonumber(f[2])
if at and at ~= tonumber(ARGV[3]) then return at end
if not f[2] and slot_moving_once(KEYS[1]) then return try_again() end
local target = tonumber(ARGV[2])
if target == here then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'at', target)
end
return target
