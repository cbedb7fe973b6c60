--[[
  Index dead letters made before the index existed (a daemon walks each
  partition's stream once, oldest first, and hands its entries over in
  batches). A pointer only ever moves to a newer entry that still exists,
  so a replay, drop or new dead letter racing the walk is never undone.

  Input:
    KEYS[1] dead stream       <ns>:{p}:dead
    KEYS[2] dead-letter index <ns>:{p}:dead:ids
    ARGV[1] 1 when this is the walk's last batch (the index is then
            marked complete), else 0
    ARGV[2] a job id; then, for every entry, two arguments:
    ARGV[3] its dead-letter entry id
  Output:
    the number of pointers written
]]
-- Entry ids `<ms>-<seq>` as two numbers, for ordering.
local function entry_order(entry)
  local ms, n = string.match(entry or '', '^(%d+)-(%d+)$')
  return tonumber(ms) or -1, tonumber(n) or -1
end

local written = 0
for i = 2, #ARGV, 2 do
  local id, entry = ARGV[i], ARGV[i + 1]
  local ms, n = entry_order(entry)
  local old_ms, old_n = entry_order(redis.call('HGET', KEYS[2], id) or nil)
  local newer = ms > old_ms or (ms == old_ms and n > old_n)
  if newer and #redis.call('XRANGE', KEYS[1], entry, entry) > 0 then
    redis.call('HSET', KEYS[2], id, entry)
    written = written + 1
  end
end
if ARGV[1] == '1' then redis.call('HSET', KEYS[2], '~complete', '1') end
return written
