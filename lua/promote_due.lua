--[[
  Move due jobs from the due sets to the ready lists, a bounded batch at a
  time shared between the tenants with jobs due, after opening the timing
  wheel's buckets whose time has come (see the prelude): at most a batch of
  their jobs move on, to finer buckets or into the due sets.

  Input:
    KEYS[1] due zset        <ns>:{p}:due  (the default tenant's; the other
            tenants' `<ns>:{p}:due:<tenant>` and their index
            `<ns>:{p}:due-tenants` are built from it)
    KEYS[2] ready list      <ns>:{p}:ready  (the default tenant's)
    KEYS[3] wheel index     <ns>:{p}:wheel
    ARGV[1] batch size (at most this many jobs are moved, shared between
            the tenants with jobs due)
    ARGV[2] claim ahead in ms: jobs due within this much of now count as
            due (delivery.claim_ahead; the claim holds them to their time)
  Output:
    {moved, next_due, now, started, horizon, started_in}: next_due is the earliest time work is
    left (the due sets' head, or the next bucket to open; at most now while
    jobs are still due or a bucket is still being opened), or -1 when there
    is none; started is 1 when a ready list was empty before (a tenant's
    jobs the claim loop has not seen yet), else 0; horizon is now plus the
    claim ahead (jobs due by it counted as due); started_in lists the
    partitions whose ready list started when the jobs came from the shared
    timers of a single Redis (see the prelude; their ids go to their own
    partitions' lists), else it is empty.
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local now = now_ms()
local horizon = now + tonumber(ARGV[2])
local moved, next_due, started, _, started_in = promote_due_jobs(KEYS[1], KEYS[2], KEYS[3],
  tonumber(ARGV[1]), now, horizon, 0)
if not moved then return try_again() end
return {moved, next_due, now, started and 1 or 0, horizon, started_in}
