--[[
  Several calls of the library's batched functions in one FCALL (a
  single Redis only: the calls may be of different partitions). Not a
  state change of its own: each call is the function of its script (see
  BATCHED, which the library builds: promote_due, claim_ready and
  complete_jobs), run as it would run alone, one after another. The daemon
  sends together the calls its claim loops and its outcome recording make
  at the same moment, so that Redis wakes once for all of them. The calls
  read Redis's clock once, as if they ran at the same instant.

  Input:
    KEYS    each call's KEYS, one call after the other
    ARGV[1] n, the number of calls; then, per call, three arguments:
    ARGV[2] its script's name
    ARGV[3] the number of its KEYS
    ARGV[4] the number of its ARGV
            and after the n triples, each call's ARGV, one call after the
            other
  Output:
    per call, two entries: 1 and its reply (false for none), or 0 and the
    error it raised: an error stops only its own call, and what that call
    wrote before it stands, as when it runs alone. (One flat list: a table
    per call cost Redis more to build and to reply.)
]]
local function run_batch(KEYS, ARGV)
  local n = arg_number(ARGV[1])
  local out = {}
  -- One TIME for every call (see now_ms in the prelude).
  batch_now = nil
  batch_now = now_ms()
  local k, a = 1, 2 + 3 * n
  for c = 1, n do
    local h = 2 + 3 * (c - 1)
    local call = BATCHED[ARGV[h]]
    local nk, na = arg_number(ARGV[h + 1]), arg_number(ARGV[h + 2])
    -- (Constructors with unpack make each table at its size.)
    local keys, args = {unpack(KEYS, k, k + nk - 1)}, {unpack(ARGV, a, a + na - 1)}
    k, a = k + nk, a + na
    local status, reply = 0, nil
    if not call then
      reply = 'not a batched function: ' .. tostring(ARGV[h])
    else
      local ok, result = pcall(call, keys, args)
      if ok then
        status, reply = 1, result
        -- (A nil would end the list.)
        if reply == nil then reply = false end
      else
        reply = tostring(result)
      end
    end
    out[2 * c - 1], out[2 * c] = status, reply
  end
  batch_now = nil
  return out
end
