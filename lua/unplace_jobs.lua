--[[
  The daemon's sweep of placement pointers (see the prelude): after it
  checked, in the partitions they point to, which pointed-to jobs still
  exist, drops the pointers of the jobs gone and sets the others' next
  check. A pointer placed again since it was read (its check time
  changed) is left alone: its job may just have been created.

  Input:
    KEYS[1] pointer index   <ns>:{p}:placed
    ARGV[1] job key prefix  <ns>:{p}:job:  (same hash tag; the live record
            hashes are built from it)
    ARGV[2] ms until the kept pointers' next check
    ARGV[3] id of the first pointer; then, for every pointer, two arguments:
    ARGV[4] its check time as read (the score in the index)
    ARGV[5] "1" its job still exists, "0" it is gone
  Output:
    the number of pointers dropped
]]
local rcall = redis.call
local now = now_ms()
local check = string.format('%d', now + tonumber(ARGV[2]))
local prefix = partition_prefix(ARGV[1], 'job:')
local dropped = 0
for i = 3, #ARGV, 3 do
  local id = ARGV[i]
  local score = rcall('ZSCORE', KEYS[1], id)
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    if ARGV[i + 2] == '1' then
      rcall('ZADD', KEYS[1], check, id)
    else
      local at = live(prefix, id)
      -- Only a pointer goes: never a record created here since.
      if pointer_of(rcall('HGET', at.h, id)) then rec_delete(at) end
      rcall('ZREM', KEYS[1], id)
      dropped = dropped + 1
    end
  end
end
return dropped
