--[[
  Move a bounded batch of one partition's timers into the shared timers of
  a single Redis (layout 5, `hookq migrate`; see "Shared timers" in the
  prelude): members of its due sets (the default tenant's, then each
  tenant's its index names) and ids of its wheel's buckets go to the
  shared sets and buckets of the same names, keeping their scores, each
  member and bucket entry tagged with the partition (see due_tag); the
  shared index and wheel index keep each tenant's and bucket's earliest
  time. Job records are not touched: where a job waits follows from its
  state, and its sequence stays.

  Input:
    KEYS[1] the partition's due zset     <ns>:{p}:due  (its tenants' sets
            `<ns>:{p}:due:<tenant>` and their index `<ns>:{p}:due-tenants`
            are built from it)
    KEYS[2] the partition's wheel index  <ns>:{p}:wheel
    KEYS[3] the shared due zset          <ns>:{0}:t:due  (likewise)
    KEYS[4] the shared wheel index       <ns>:{0}:t:wheel
    ARGV[1] the most members and ids to move
  Output:
    the number of members and ids moved and of index entries cleared (0:
    the partition's timers are empty)
]]
local rcall = redis.call
local left = arg_number(ARGV[1])
local moved = 0
local tag = due_tag(partition_prefix(KEYS[1], 'due'))

-- Moves up to `left` members of sorted set `from` into `to`, with their
-- scores; true when `from` is left empty.
local function move_members(from, to)
  if left <= 0 then return false end
  local got = rcall('ZRANGE', from, '0', int_text(left - 1), 'WITHSCORES')
  if #got == 0 then return true end
  local scored, members = {}, {}
  for i = 1, #got, 2 do
    scored[#scored + 1] = got[i + 1]
    scored[#scored + 1] = string.sub(got[i], 1, 12) .. tag .. string.sub(got[i], 13)
    members[#members + 1] = got[i]
  end
  rcall('ZADD', to, unpack(scored))
  rcall('ZREM', from, unpack(members))
  left, moved = left - #members, moved + #members
  return rcall('EXISTS', from) == 0
end

move_members(KEYS[1], KEYS[3])
-- The tenants' sets, and their places in the index.
local index, shared_index = due_index(KEYS[1]), due_index(KEYS[3])
local tenants = rcall('ZRANGE', index, '0', '63', 'WITHSCORES')
for i = 1, #tenants, 2 do
  if left <= 0 then break end
  local tenant, earliest = tenants[i], tenants[i + 1]
  rcall('ZADD', shared_index, 'LT', earliest, tenant)
  if move_members(KEYS[1] .. ':' .. tenant, KEYS[3] .. ':' .. tenant) then
    rcall('ZREM', index, tenant)
    moved = moved + 1
  end
end
-- The wheel's buckets, bucket by bucket.
local from_prefix, to_prefix = timers_prefix(KEYS[1]), timers_prefix(KEYS[3])
local buckets = rcall('ZRANGE', KEYS[2], '0', '15', 'WITHSCORES')
for i = 1, #buckets, 2 do
  if left <= 0 then break end
  local slot, opens = buckets[i], buckets[i + 1]
  local from = from_prefix .. 'wheel:' .. slot
  local ids = rcall('LRANGE', from, '0', int_text(left - 1))
  if #ids > 0 then
    local entries = {}
    for i, id in ipairs(ids) do entries[i] = tag .. id end
    for first = 1, #entries, 1000 do
      rcall('RPUSH', to_prefix .. 'wheel:' .. slot, unpack(entries, first, math.min(first + 999, #entries)))
    end
    rcall('ZADD', KEYS[4], 'LT', opens, slot)
    rcall('LTRIM', from, #ids, -1)
    left, moved = left - #ids, moved + #ids
  end
  if rcall('EXISTS', from) == 0 then
    rcall('ZREM', KEYS[2], slot)
    moved = moved + 1
  end
end
return moved
