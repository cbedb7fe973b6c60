--[[
  Create or change a schedule (see src/schedule.rs). A schedule is a HASH
  `<ns>:{p}:sched:<id>` of its partition (the partition of its id), with
  few fields (each field of a hash that outgrows the listpack encoding
  costs ~50 bytes):

    spec    its rule (JSON without the job), compared on a re-create
    tmpl    the spec JSON of the jobs it fires (the template, with
            `schedule_id`), stored as each fired job's spec; compared too
    meta    `<ver> <max> <lease> <overlap> <paused> <anchor> <ct> <ut>
            <order>`: the version (bumped by every change, so a firing
            computed from an older version is refused), attempts allowed
            to a fired job, its lease in ms (0: the daemon default),
            `allow` or `skip`, 1 while paused, the creation time (the
            anchor of `every`), created and updated (ms), and its jobs'
            ordering list `<topic>:<ordering key>` (empty for none: such a
            schedule lives in its key's partition, its id's holding a stub,
            see place_schedule.lua)
    next    its next fire time (ms), "" once it has ended
    last    the last runs, newest first, at most 10: `<ms><f|s>` joined by ","
            (f fired, s skipped); written by the firings
    prev    the id of the last job it fired (for `overlap = "skip"`)

  An active schedule is in the partition's fire index, scored by its next
  fire time; every schedule is in the partition's schedule index (score 0,
  ordered by id, for listing).

  Input:
    KEYS[1] fire index      <ns>:{p}:fires
    KEYS[2] schedule index  <ns>:{p}:schedules
    ARGV[1] key prefix      <ns>:{p}:  (the schedule's hash is built from it)
    ARGV[2] id
    ARGV[3] "create" (idempotent by id) or "replace" (a change)
    ARGV[4] spec JSON
    ARGV[5] template JSON
    ARGV[6] max attempts
    ARGV[7] lease in ms, or ""
    ARGV[8] "1" paused, "0" active
    ARGV[9] next fire time (ms), or "" (ended)
    ARGV[10] anchor (ms): create only
    ARGV[11] replace: the version the change was computed from
    ARGV[12] wake channel
    ARGV[13] partition number
    ARGV[14] overlap: "allow" or "skip"
    ARGV[15] its jobs' ordering list, or ""
    ARGV[16] create: "c" to compare only (NOT_FOUND when absent)
  Output:
    {code, version}: DONE written; UNCHANGED (create) an identical schedule
    exists; CHANGED (create) the id exists with other content, (replace)
    the schedule changed since it was read; NOT_FOUND (replace) no such
    schedule; ELSEWHERE (create) a stub names partition `version` (the
    codes of the prelude). Nothing changes unless DONE.
    TRYAGAIN, with nothing changed, while the partition's slot is migrating.
]]
local rcall = redis.call
local key = ARGV[1] .. 'sched:' .. ARGV[2]
local f = rcall('HMGET', key, 'spec', 'tmpl', 'meta', 'at')
local m = schedule_meta(f[3])
local old_version = m and m.ver or 0
if ARGV[3] == 'create' then
  if f[1] then
    if f[1] == ARGV[4] and f[2] == ARGV[5] then return {UNCHANGED, old_version} end
    return {CHANGED, old_version}
  end
  if f[4] then return {ELSEWHERE, tonumber(f[4])} end
  if slot_moving_once(KEYS[1]) then return try_again() end
  if ARGV[16] == 'c' then return {NOT_FOUND, 0} end
else
  if not f[1] then
    if slot_moving_once(KEYS[1]) then return try_again() end
    return {NOT_FOUND, 0}
  end
  if tostring(old_version) ~= ARGV[11] then return {CHANGED, old_version} end
end

local now = now_ms()
local version = old_version + 1
local anchor, created = ARGV[10], now
if m then anchor, created = m.anchor, m.ct end
local meta = table.concat({version, tonumber(ARGV[6]), tonumber(ARGV[7]) or 0, ARGV[14], ARGV[8],
  string.format('%d', anchor), string.format('%d', created), string.format('%d', now), ARGV[15]}, ' ')
rcall('HSET', key, 'spec', ARGV[4], 'tmpl', ARGV[5], 'meta', meta, 'next', ARGV[9])
rcall('ZADD', KEYS[2], 0, ARGV[2])
if ARGV[8] == '1' or ARGV[9] == '' then
  rcall('ZREM', KEYS[1], ARGV[2])
else
  local head = tonumber(rcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2])
  rcall('ZADD', KEYS[1], ARGV[9], ARGV[2])
  if not head or tonumber(ARGV[9]) < head then
    rcall('PUBLISH', ARGV[12] .. ':' .. ARGV[13], 'f' .. ARGV[13] .. ':' .. ARGV[9])
  end
end
return {DONE, version}
