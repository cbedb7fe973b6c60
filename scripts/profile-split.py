#!/usr/bin/env python3
"""Splits a profile of redis-server by what Redis was doing (used by
scripts/profile-redis.sh).

  perf FILE      FILE is `perf script` output of `perf record --call-graph
                 dwarf`: each sample goes to one group, by its stack: a
                 command a script ran (`cmd:<function>`), the work around
                 a redis.call (arguments and reply converted), Lua's
                 garbage collection, the KEYS/ARGV tables of a call, the
                 reply of a function, other Lua work (by its leaf), the
                 event loop's reading and parsing, its writing, cron.
  slowlog FILE   FILE is `redis-cli --json SLOWLOG GET` output with every
                 command logged: each library function's and command's
                 total time, calls, time a call and arguments a call.
                 (The log lists the commands a script ran too; a
                 function's time includes theirs. It keeps at most 32
                 arguments of a call, so a larger call reads 32.)
"""
import collections
import json
import sys


def perf_stacks(path):
    """Each sample's stack, leaf first, as function names."""
    stacks, current = [], []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip()
            if not line:
                if current:
                    stacks.append(current)
                current = []
            elif line[0] in " \t":
                parts = line.split()
                if len(parts) >= 2:
                    current.append(parts[1].split("+")[0])
    if current:
        stacks.append(current)
    return stacks


LUA_LIBRARY = {"luaV_concat", "str_sub", "str_format", "str_byte", "b_unpack", "b_pack",
               "luaS_newlstr", "resize", "luaH_getn", "luaB_unpack", "ipairsaux",
               "luaB_tonumber", "luaB_type"}


def group_of(stack):
    """The group of one sample (see the module's doc)."""
    if "scriptCall" in stack:
        i = stack.index("scriptCall") - 1
        while i >= 0 and stack[i] == "call":
            i -= 1
        return "cmd:" + (stack[i] if i >= 0 else "?")
    if "luaRedisGenericCommand" in stack:
        return "redis.call conversions"
    if "luaC_step" in stack or "luaC_fullgc" in stack:
        return "lua garbage collection"
    if "luaCreateArray" in stack:
        return "lua KEYS/ARGV tables"
    if "luaReplyToRedisReply" in stack:
        return "lua reply to Redis"
    if "luaV_execute" in stack:
        for f in stack[:6]:
            if f in LUA_LIBRARY:
                return "lua:" + f
        return "lua:vm " + stack[0]
    if "readQueryFromClient" in stack:
        return "event loop: read and parse"
    if any(f in stack for f in ("handleClientsWithPendingWrites", "writeToClient")):
        return "event loop: write"
    if "serverCron" in stack or "processTimeEvents" in stack:
        return "cron"
    return "other:" + stack[0]


def perf(path):
    stacks = perf_stacks(path)
    n = len(stacks)
    if n == 0:
        sys.exit(f"{path}: no samples")
    groups = collections.Counter(group_of(s) for s in stacks)
    coarse = collections.Counter()
    for k, v in groups.items():
        coarse[k.split(":")[0] if k.startswith(("cmd:", "lua:", "other:")) else k] += v
    print(f"{n} samples\n\nby kind:")
    for k, v in coarse.most_common():
        print(f"  {v * 100 / n:5.1f} %  {k}")
    print("\nby group (>= 0.5 %):")
    for k, v in groups.most_common():
        if v * 200 >= n:
            print(f"  {v * 100 / n:5.1f} %  {k}")


def slowlog(path):
    with open(path, "rb") as f:
        entries = json.loads(f.read().decode("latin-1"))
    totals = collections.defaultdict(lambda: [0, 0, 0])
    for entry in entries:
        micros, args = entry[2], entry[3]
        name = args[0].lower()
        if name in ("fcall", "fcall_ro", "evalsha") and len(args) > 1:
            # hookq_<digest>_<script>: the script's name.
            name = f"{name} {args[1].split('_', 2)[-1]}"
        t = totals[name]
        t[0] += 1
        t[1] += micros
        t[2] += len(args)
    functions = sum(t[1] for k, t in totals.items() if k.startswith(("fcall", "evalsha")))
    print(f"{'':32} {'calls':>7} {'µs':>9} {'µs a call':>10} {'args a call':>12}")
    for name, (calls, micros, args) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:32} {calls:7d} {micros:9d} {micros / calls:10.1f} {args / calls:12.0f}")
    print(f"functions' time in all: {functions} µs")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("perf", "slowlog"):
        sys.exit(__doc__)
    {"perf": perf, "slowlog": slowlog}[sys.argv[1]](sys.argv[2])
