--[[
  One daemon's heartbeat in the fleet of its namespace: the daemons that
  share a Redis deal its partitions out among themselves (see src/fleet.rs),
  each from the same list of live members. A member stays live until its
  expiry; a daemon that stops beating (killed) drops out once it passes, and
  one that stops cleanly leaves at once.

  Input:
    KEYS[1] members zset   <ns>:fleet  (member = daemon id, score = expiry ms)
    ARGV[1] this daemon's id
    ARGV[2] how long its membership lasts without another beat, in ms; 0 to
            leave now
  Output:
    {id1, id2, ...}: the live members (this daemon among them unless it
    left), in no particular order.
]]
local rcall = redis.call
local now = now_ms()
local ttl = tonumber(ARGV[2])
rcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ttl > 0 then
  rcall('ZADD', KEYS[1], string.format('%d', now + ttl), ARGV[1])
else
  rcall('ZREM', KEYS[1], ARGV[1])
end
return rcall('ZRANGE', KEYS[1], 0, -1)
