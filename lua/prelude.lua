--[[
  Prepended to every script of this directory (it is not a script itself).

  During a Redis Cluster slot migration a partition's keys leave the source
  node one batch at a time. Redis checks a script's declared KEYS up front
  (TRYAGAIN or ASK when some have moved), but the per-job keys a script
  builds from an id are checked only when touched: on the source node a key
  that has left fails the script at that command, after its earlier writes;
  on the target node a key that has not arrived yet reads as absent.

  So every script reads each per-job key it will write before its first
  write, and when one is absent it asks `slot_moving`: if the partition's
  slot is migrating or importing on this node, the script answers TRYAGAIN
  having changed nothing, and the caller retries after the migration.

  `IN_CLUSTER` (defined above this prelude when the store compiles the
  scripts) is false on a single Redis, where no slot moves: reads made only
  for this guard are skipped there.
]]

-- Whether the cluster slot of `key` is migrating from or importing to this
-- node right now; always false outside a cluster.
local function slot_moving(key)
  if not IN_CLUSTER then return false end
  local nodes = redis.pcall('CLUSTER', 'NODES')
  if type(nodes) ~= 'string' then return false end
  local me = string.match(nodes, '[^\n]*myself[^\n]*')
  if not me then return false end
  local slot = redis.call('CLUSTER', 'KEYSLOT', key)
  return string.find(me, '[' .. slot .. '-', 1, true) ~= nil
end

-- The answer of a script that gave up, unchanged, because its slot is moving.
local function try_again()
  return redis.error_reply('TRYAGAIN hookq: the partition\'s slot is being migrated; nothing changed')
end

local moving_checked = false
-- Called when a key the script needs is absent: whether that is because the
-- slot of `key` is moving (then the script must give up). Asked once per
-- call: the answer cannot change while a script runs.
local function slot_moving_once(key)
  if moving_checked then return false end
  moving_checked = true
  return slot_moving(key)
end
