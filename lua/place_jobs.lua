--[[
  Place jobs that belong in another partition than their id's (an ordered
  job lives where its ordering key does): in the id's partition, each id
  gets a pointer to the partition its job lives in (see the prelude), so
  that a lookup or a create by id alone finds it. Run before the job is
  created there; an id whose job already exists here, or that already
  points elsewhere, keeps its place (the caller then compares with the job
  where it is).

  Input:
    KEYS[1] pointer index   <ns>:{p}:placed
    ARGV[1] job key prefix  <ns>:{p}:job:  (same hash tag; the live record
            hashes, kept records and summaries are built from it)
    ARGV[2] this partition's number
    ARGV[3] ms until a pointer is checked by the daemon's sweep
    ARGV[4] id of the first job; then, for every job, three arguments:
    ARGV[5] the partition it should live in
    ARGV[6] "" or a partition number: a pointer to that partition is
            replaced (its job was found gone there)
  Output:
    {p1, p2, ...} per job in order, the partition where it lives or is to
    be created.
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local rcall = redis.call
local now = now_ms()
local here = tonumber(ARGV[2])
local check = string.format('%d', now + tonumber(ARGV[3]))
local prefix = partition_prefix(ARGV[1], 'job:')

-- Read pass: where each id's job is now.
local plans = {}
local done_index = nil
for i = 4, #ARGV, 3 do
  local id = ARGV[i]
  local at = live(prefix, id)
  local v = rcall('HGET', at.h, id)
  local pointer = pointer_of(v)
  local exists = v ~= false and v ~= nil and not pointer
  if not exists and not pointer then
    exists = rcall('EXISTS', prefix .. 'job:' .. id) == 1
    if not exists then
      done_index = done_index or rcall('HGETALL', prefix .. 'done')
      exists = #done_index > 0 and summary_find(prefix, id, now, done_index) ~= nil
    end
    -- The id may exist on the other node of a migration.
    if not exists and slot_moving_once(KEYS[1]) then return try_again() end
  end
  plans[#plans + 1] = {at = at, pointer = pointer, exists = exists, target = tonumber(ARGV[i + 1]),
    replace = tonumber(ARGV[i + 2])}
end

local out = {}
local placed = {} -- id -> partition, as this call left it
for i, plan in ipairs(plans) do
  local id = plan.at.id
  local home
  if placed[id] then
    home = placed[id]
  elseif plan.exists then
    home = here
  elseif plan.pointer and plan.pointer ~= plan.replace then
    home = plan.pointer
    rcall('ZADD', KEYS[1], check, id)
  elseif plan.target == here then
    home = here
    if plan.pointer then
      rec_delete(plan.at)
      rcall('ZREM', KEYS[1], id)
    end
  else
    home = plan.target
    rcall('HSET', plan.at.h, id, '@' .. home)
    rcall('ZADD', KEYS[1], check, id)
  end
  placed[id] = home
  out[i] = home
end
return out
