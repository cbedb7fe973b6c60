--[[
  Seed the ledger of one partition (see the prelude), once: the jobs live
  before the ledger existed were created without being counted, so
  `default:created` gains the number of live records (data written before
  tenants is all the default tenant's), and the field `~seeded` marks the
  ledger so that this never runs twice. The live records are the fields of
  the 64 record hashes, less the placement pointers among them (ids whose
  job lives in another partition, where it is counted).

  Input:
    KEYS[1] ledger hash       <ns>:{p}:ledger
    KEYS[2] pointer index     <ns>:{p}:placed
    ARGV[1] job key prefix    <ns>:{p}:job:  (same hash tag; the live record
            hashes `<ns>:{p}:jobs:<shard>` are built from it)
  Output:
    the number of live jobs counted; UNCHANGED (0, of the prelude) when
    the ledger was seeded already (nothing changed)
]]
local rcall = redis.call
if rcall('HEXISTS', KEYS[1], '~seeded') == 1 then return UNCHANGED end
local prefix = partition_prefix(ARGV[1], 'job:')
local records = 0
for shard = 0, JOB_SHARDS - 1 do
  records = records + rcall('HLEN', prefix .. 'jobs:' .. shard)
end
local pointers = 0
for _, id in ipairs(rcall('ZRANGE', KEYS[2], 0, -1)) do
  if pointer_of(rcall('HGET', live(prefix, id).h, id)) then pointers = pointers + 1 end
end
local live_jobs = records - pointers
if live_jobs > 0 then rcall('HINCRBY', KEYS[1], 'default:created', live_jobs) end
rcall('HSET', KEYS[1], '~seeded', '1')
return live_jobs
