--[[
  Convert job records of one partition from layout 2 (every record a string
  `<ns>:{p}:job:<id>`: a 33-byte header, then the spec JSON) to layout 3: the
  header gains `given` (see the prelude), read from the spec's `run_at` or
  `delay_ms`; a live job's record (scheduled, ready, in flight) moves to a
  field of its record hash `<ns>:{p}:jobs:<shard>`, a finished one stays a
  string with its time to live. A layout-2 record is told by its spec's `{`
  right after the 33-byte header (where layout 3 has `given`, whose first
  byte is never `{`). Records already converted, or gone, are skipped, so a
  migration that was interrupted is resumed by running it again.

  Input:
    KEYS[1] stats hash        <ns>:{p}:stats  (declares the partition's slot)
    ARGV[1] job key prefix    <ns>:{p}:job:
    ARGV[2] id of the first job; then one id per job
  Output:
    {converted, skipped}
]]
local rcall = redis.call
local prefix = partition_prefix(ARGV[1], 'job:')
local converted, skipped = 0, 0
for i = 2, #ARGV do
  local id = ARGV[i]
  local at = kept(prefix, id)
  local v = rcall('TYPE', at.k)['ok'] == 'string' and rcall('GET', at.k)
  if v and #v > 33 and string.sub(v, 34, 34) == '{' then
    local r = {}
    r.state, r.ut, r.att, r.max, r.due, r.seq, r.ct, r.lease = struct.unpack('>c1I6I2I2I6I6I6I4', v)
    r.spec = string.sub(v, 34)
    r.given = given_of_spec(r.spec)
    if r.state == 's' or r.state == 'w' or r.state == 'p' or r.state == 'r' or r.state == 'i' then
      rec_put(live(prefix, id), r)
      rcall('DEL', at.k)
    else
      local ttl = rcall('PTTL', at.k)
      rec_put(at, r)
      if ttl > 0 then rcall('PEXPIRE', at.k, ttl) end
    end
    converted = converted + 1
  else
    skipped = skipped + 1
  end
end
return {converted, skipped}
