--[[
  Convert job records of one partition from layout 1 (a hash per job) to
  layout 3 (the prelude's header, then the spec JSON: a live job's as a
  field of its record hash, a finished job's as a string keeping its time to
  live). Keys already converted, or gone, are skipped,
  so a migration that was interrupted is resumed by running it again. A
  parked job gets a parking sequence and its parking entry is renamed to
  match (layouts 2 and 3 park `<seq><id>`, as the due set does). A hash without a
  spec (a bare record left by hand) is deleted.

  Input:
    KEYS[1] sequence          <ns>:{p}:seq
    ARGV[1] job key prefix    <ns>:{p}:job:
    ARGV[2] partition prefix  <ns>:{p}:  (parking zsets are <prefix>park:<host>)
    ARGV[3] id of the first job; then one id per job
  Output:
    {converted, skipped}
]]
local rcall = redis.call
local codes = {scheduled = 's', ready = 'r', inflight = 'i', delivered = 'd', dead = 'x',
  cancelled = 'c'}
local converted, skipped = 0, 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local key = ARGV[1] .. id
  if rcall('TYPE', key)['ok'] ~= 'hash' then
    skipped = skipped + 1
  else
    local flat = rcall('HGETALL', key)
    local f = {}
    for j = 1, #flat, 2 do f[flat[j]] = flat[j + 1] end
    local ttl = rcall('PTTL', key)
    local state = codes[f.state]
    rcall('DEL', key)
    if f.job and state then
      local r = {state = state, ut = tonumber(f.ut) or 0, att = tonumber(f.att) or 0,
        max = tonumber(f.max) or 1, due = tonumber(f.due) or 0, seq = 0,
        ct = tonumber(f.ct) or 0, lease = tonumber(f.lease) or 0, given = given_of_spec(f.job)}
      if state == 's' and f.park then
        local park = ARGV[2] .. 'park:' .. f.park
        r.state, r.seq = 'p', rcall('INCR', KEYS[1])
        rcall('ZREM', park, id)
        rcall('ZADD', park, string.format('%d', r.due), due_member(r.seq, id, ''))
        rcall('SADD', ARGV[2] .. 'parked', f.park)
      elseif state == 's' and f.seq then
        r.seq = tonumber(f.seq, 16) or 0
      end
      if state == 'x' and f.dl then rec_set_dead(r, f.dl, r.ut) end
      if state == 'd' or state == 'x' or state == 'c' then
        -- Finished: kept whole until it expires, as layout 1 kept it.
        rec_create(kept(ARGV[2], id), r, f.job)
        if ttl > 0 then rcall('PEXPIRE', key, ttl) end
      else
        rec_create(live(ARGV[2], id), r, f.job)
      end
    end
    converted = converted + 1
  end
end
return {converted, skipped}
