--[[
  Move due jobs from the due set to the ready list, a bounded batch at a time,
  after opening the timing wheel's buckets whose time has come (see the
  prelude): at most a batch of their jobs move on, to finer buckets or into
  the due set.

  Input:
    KEYS[1] due zset        <ns>:{p}:due
    KEYS[2] ready list      <ns>:{p}:ready
    KEYS[3] wheel index     <ns>:{p}:wheel
    ARGV[1] batch size (at most this many jobs are moved)
  Output:
    {moved, next_due, now}: next_due is the earliest time work is left (the
    due set's head, or the next bucket to open; at most now when a bucket is
    still being opened), or -1 when there is none.
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local now = now_ms()
local moved, next_due = promote_due_jobs(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), now)
if not moved then return try_again() end
return {moved, next_due, now}
