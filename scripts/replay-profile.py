#!/usr/bin/env python3
"""Deterministic profiles of the Lua library on captured traffic.

A steady load's Redis CPU per job varies +-10 % between runs on a shared
host, which hides most single changes. This tool takes that noise away:

  capture BENCH SCENARIO DIR [--seconds S] [--at T]
      Runs one benchmark scenario (BENCH is the bench binary,
      `target/release/deps/bench-<hash>`), and T s (5) into it snapshots its
      Redis (CLIENT PAUSE, a marker, SAVE) and records S seconds of MONITOR
      after the snapshot. DIR gets dump.rdb, monitor.txt and lib.lua (the
      Functions library the daemon loaded). The pause leaves a backlog that
      the calls after it catch up with in larger batches than a steady load
      makes: for a steady scenario, snapshot while it waits for its first
      due time (`--at 3` for steady_2000: the daemon starts, the jobs are
      enqueued, then nothing is due for 2 s and more) and record the whole
      due window (`--seconds 14`).

  replay DIR [--lib FILE] [--skip N] [--callgrind OUT] [--server PATH]
      Starts a private redis-server on a loopback port from DIR/dump.rdb,
      loads the library (DIR/lib.lua, or FILE: dump another build's with
      `capture`, or edit a copy), and sends the captured FCALLs after the
      marker one after another, each with the clock it had (the library's
      now_ms is patched to read the key `hqnow`, which the replay sets to
      the call's MONITOR time). Prints the calls, their microseconds
      (commandstats), a digest of every reply and Redis's DEBUG DIGEST of
      the data at the end: two libraries that give the same two digests did
      the same thing to the same traffic. With --callgrind, Redis runs under
      `valgrind --tool=callgrind` (counting only inside FCALL; with --skip
      N, only after the first N calls, e.g. past the backlog the snapshot's
      pause left) and the instruction count (Ir) is printed: it repeats
      within 0.2 % between runs. Use a redis-server built with symbols
      (--server) to read the profile by function (callgrind_annotate).
      --commands prints the commands the calls made (commandstats, after
      the skipped ones). --fresh-summaries deletes every partition's
      summary index before the replay, so that the first outcome makes a
      new bucket as in a fresh benchmark run (the replies stay comparable;
      the data digest then differs from a plain replay's). --by-function
      (with --callgrind) sends each call of a batch as its own FCALL, one
      callgrind dump each, and prints the instructions of each function of
      the library, with a least-squares split into a part per call and a
      part per job. --cold MB runs Redis and the replay on one core and
      copies MB megabytes there before each call, evicting the caches as
      the daemon and the receiver do between a live load's rounds: the
      FCALL time then comes nearer the live one (steady_200: 36 us a job
      against 24 warm and ~85 live) and still repeats within ~5 %.

Loopback only; the replay's Redis is killed at the end.
"""
import argparse
import glob
import hashlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

MARK = b"hqmark"


def resp(args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


class Conn:
    """A minimal RESP client (bulk strings in, nested replies out)."""

    def __init__(self, port):
        for _ in range(600):
            try:
                self.sock = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.1)
        else:
            sys.exit(f"no Redis on port {port}")
        self.file = self.sock.makefile("rb")

    def read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind in (b"+", b"-", b":"):
            return kind + rest
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2]
        if kind == b"*":
            return [self.read() for _ in range(max(int(rest), 0))]
        raise RuntimeError(f"unexpected reply {line!r}")

    def call(self, *args):
        self.sock.sendall(resp(args))
        return self.read()


def unrepr(text):
    """MONITOR's quoted argument back to bytes."""
    out, i = bytearray(), 0
    escapes = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", "\\": b"\\", '"': b'"'}
    while i < len(text):
        c = text[i]
        if c == "\\" and text[i + 1] == "x":
            out.append(int(text[i + 2 : i + 4], 16))
            i += 4
        elif c == "\\":
            out += escapes[text[i + 1]]
            i += 2
        else:
            out += c.encode("latin-1")
            i += 1
    return bytes(out)


def captured_calls(path):
    """The clients' FCALLs after the marker: (ms, args)."""
    calls, seen = [], False
    with open(path, encoding="latin-1") as monitor:
        for line in monitor:
            if '"hqmark"' in line:
                seen = True
                continue
            m = re.match(r"^(\d+\.\d+) \[\d+ ([^\]]+)\] (.*)$", line.rstrip("\n"))
            if not seen or not m or m.group(2) == "lua":
                continue
            args = [unrepr(a) for a in re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(3))]
            if args and args[0].upper() == b"FCALL":
                calls.append((int(float(m.group(1)) * 1000), args))
    return calls


def capture(a):
    os.makedirs(a.dir, exist_ok=True)
    bench = subprocess.Popen(
        [a.bench, "--bench", "--only", a.scenario + "$", "--runs", "1"],
        stdout=open(os.path.join(a.dir, "bench.out"), "w"),
        stderr=subprocess.STDOUT,
    )
    port = None
    for _ in range(100):
        time.sleep(0.1)
        ps = subprocess.run(["ps", "-o", "args=", "--ppid", str(bench.pid)], capture_output=True, text=True).stdout
        m = re.search(r"redis-server \S*:(\d+)", ps) or re.search(r"redis-server.*--port (\d+)", ps)
        if m:
            port = int(m.group(1))
            break
    if not port:
        bench.kill()
        sys.exit("the scenario's redis-server was not found")
    time.sleep(a.at)
    monitor = subprocess.Popen(
        ["timeout", str(a.seconds + 1), "redis-cli", "-p", str(port), "monitor"],
        stdout=open(os.path.join(a.dir, "monitor.txt"), "w"),
    )
    time.sleep(0.3)
    redis = Conn(port)
    redis.call("CLIENT", "PAUSE", "5000", "ALL")
    redis.call("ECHO", MARK)
    redis.call("SAVE")
    redis.call("CLIENT", "UNPAUSE")
    folder = redis.call("CONFIG", "GET", "dir")[1].decode()
    name = redis.call("CONFIG", "GET", "dbfilename")[1].decode()
    shutil.copy(os.path.join(folder, name), os.path.join(a.dir, "dump.rdb"))
    libraries = redis.call("FUNCTION", "LIST", "WITHCODE")
    code = next(
        entry[i + 1]
        for entry in libraries
        for i in range(0, len(entry), 2)
        if entry[i] == b"library_code" and entry[i + 1].startswith(b"#!lua name=hookq_")
    )
    with open(os.path.join(a.dir, "lib.lua"), "wb") as lib:
        lib.write(code)
    monitor.wait()
    bench.wait()
    print(f"captured {len(captured_calls(os.path.join(a.dir, 'monitor.txt')))} FCALLs in {a.dir}")


def replay_library(code):
    """The library renamed `hqreplay`, its clock read from `hqnow`."""
    name = re.match(rb"#!lua name=(\S+)", code).group(1)
    code = code.replace(name, b"hqreplay")
    clock = b"  if batch_now then return batch_now end\n"
    if clock not in code:
        sys.exit("the library's now_ms has changed: teach replay_library its first line")
    fake = b"  local fake = redis.call('GET', 'hqnow')\n  if fake then return tonumber(fake) end\n"
    return code.replace(clock, clock + fake, 1)


def batch_parts(args):
    """An FCALL's calls of the library's functions: [(script, numkeys + keys + argv)],
    the batch function's calls one by one (see lua/batch.lua), any other call as it is."""
    name = re.sub(rb"^hookq_[0-9a-f]+_", b"", args[1])
    if name != b"batch":
        return [(name, args[2:])]
    nk = int(args[2])
    keys, argv = args[3 : 3 + nk], args[3 + nk :]
    n = int(argv[0])
    k, a, parts = 0, 1 + 3 * n, []
    for c in range(n):
        script, ck, ca = argv[1 + 3 * c], int(argv[2 + 3 * c]), int(argv[3 + 3 * c])
        parts.append((script, [str(ck).encode()] + keys[k : k + ck] + argv[a : a + ca]))
        k, a = k + ck, a + ca
    return parts


def outcome_args(code):
    """complete_jobs's arguments per job in library `code` (the build that
    made the captured calls: its loop over them, `for i = 7, #ARGV, <n>`)."""
    body = code.split(b"batched_complete_jobs = function", 1)[-1]
    found = re.search(rb"for i = 7, #ARGV, (\d+) do", body)
    if not found:
        sys.exit("complete_jobs's arguments per job not found in the captured library")
    return int(found.group(1))


def jobs_of(script, args, reply, per_outcome):
    """How many jobs one call of `script` handled (claimed, or recorded;
    `per_outcome` arguments a recorded job)."""
    argv = args[1 + int(args[0]) :]
    if script == b"claim_ready" and isinstance(reply, list):
        # {now, more, moved, next_due, horizon, started_in, then five a job}
        return (len(reply) - 6) // 5
    if script == b"complete_jobs":
        # (A unit whose id is empty starts another partition's jobs.)
        return sum(1 for i in range(6, len(argv), per_outcome) if argv[i] != b"")
    return 0


def dump_instructions(path):
    """The instruction count of one callgrind dump."""
    with open(path) as dump:
        for line in dump:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    return 0


def print_by_function(out, measured):
    """Instructions per function of the library, per call and per job, and a
    least-squares split of each into a part per call and a part per job."""
    totals = {}
    for n, script, jobs in measured:
        t = totals.setdefault(script, {"calls": 0, "ir": 0, "jobs": 0, "points": []})
        ir = dump_instructions(f"{out}.{n}")
        t["calls"] += 1
        t["ir"] += ir
        t["jobs"] += jobs
        t["points"].append((jobs, ir))
    for script, t in sorted(totals.items()):
        line = (f"  {script.decode():16} calls {t['calls']:5}  Ir {t['ir'] / 1e6:8.1f} M  jobs {t['jobs']:6}"
                f"  Ir per call {t['ir'] / t['calls']:9.0f}")
        xs = [x for x, _ in t["points"]]
        if t["jobs"] and len(set(xs)) > 1:
            fit = statistics.linear_regression(xs, [y for _, y in t["points"]])
            line += f"  = {fit.intercept:.0f} + {fit.slope:.0f} per job"
        print(line)


def replay(a):
    calls = captured_calls(os.path.join(a.dir, "monitor.txt"))
    with open(a.lib or os.path.join(a.dir, "lib.lua"), "rb") as lib:
        code = replay_library(lib.read())
    # (The calls are laid out as the captured build made them.)
    with open(os.path.join(a.dir, "lib.lua"), "rb") as lib:
        per_outcome = outcome_args(lib.read())
    if a.by_function and not a.callgrind:
        sys.exit("--by-function needs --callgrind OUT")
    work = tempfile.mkdtemp(prefix="hq-replay-")
    shutil.copy(os.path.join(a.dir, "dump.rdb"), work)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [a.server, "--port", str(port), "--bind", "127.0.0.1", "--dir", work, "--save", "",
               "--appendonly", "no", "--enable-debug-command", "yes"]
    if a.callgrind:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={a.callgrind}",
                   "--collect-atstart=no", "--toggle-collect=fcallCommand"] + command
        if a.by_function:
            for old in glob.glob(a.callgrind + ".*"):
                os.remove(old)
            command.insert(5, "--dump-after=fcallCommand")
    if a.cold:
        # Redis and this process share one core, whose caches the copies
        # below evict between calls (as a live daemon and receiver do).
        command = ["taskset", "-c", "0"] + command
        os.sched_setaffinity(0, {0})
        thrash_from = bytearray(a.cold << 20)
        thrash_to = bytearray(a.cold << 20)
    server = subprocess.Popen(command, stdout=open(os.path.join(work, "log"), "w"), stderr=subprocess.STDOUT)
    try:
        redis = Conn(port)
        while b"loading:0" not in redis.call("INFO", "persistence"):
            time.sleep(0.1)
        loaded = redis.call("FUNCTION", "LOAD", "REPLACE", code)
        if loaded.startswith(b"-"):
            sys.exit(loaded.decode())
        if a.fresh_summaries:
            # Every partition's summary index goes, so that the first
            # outcome makes a new bucket, as in a fresh benchmark run.
            cursor = b"0"
            while True:
                cursor, keys = redis.call("SCAN", cursor, "MATCH", "*:done", "COUNT", "1000")
                for key in keys:
                    redis.call("DEL", key)
                if cursor == b"0":
                    break

        def fcall_stats():
            m = re.search(rb"cmdstat_fcall:calls=(\d+),usec=(\d+)", redis.call("INFO", "commandstats"))
            return (int(m.group(1)), int(m.group(2))) if m else (0, 0)

        replies, errors, first = hashlib.sha1(), 0, fcall_stats()
        dumps, measured = 0, []
        for i, (ms, args) in enumerate(calls):
            if i == a.skip and a.skip and a.callgrind and not a.by_function:
                subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True)
            if i == a.skip:
                if a.commands:
                    redis.call("CONFIG", "RESETSTAT")
                first = fcall_stats()
            redis.call("SET", "hqnow", ms)
            if a.cold:
                thrash_to[:] = thrash_from
            if a.by_function:
                # One FCALL per call of the batch, each its own dump.
                for script, part in batch_parts(args):
                    reply = redis.call(b"FCALL", b"hqreplay_" + script, *part)
                    dumps += 1
                    if i >= a.skip:
                        measured.append((dumps, script, jobs_of(script, part, reply, per_outcome)))
            else:
                name = re.sub(rb"^hookq_[0-9a-f]+", b"hqreplay", args[1])
                reply = redis.call(args[0], name, *args[2:])
            errors += isinstance(reply, bytes) and reply.startswith(b"-")
            replies.update(repr(reply).encode())
        last = fcall_stats()
        stats = redis.call("INFO", "commandstats") if a.commands else b""
        redis.call("DEL", "hqnow")
        data = redis.call("DEBUG", "DIGEST")
        try:
            redis.call("SHUTDOWN", "NOSAVE")
        except (ConnectionError, RuntimeError):
            pass  # (the connection closes as Redis exits)
    finally:
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)
    measured_calls = last[0] - first[0]
    # (With --by-function the FCALLs counted are the batches' calls sent one
    # by one, and the reply digest is of their replies.)
    what = "calls sent one by one" if a.by_function else "calls"
    print(f"{what} {measured_calls} (of {len(calls)} captured), errors {errors}, FCALL us {last[1] - first[1]}, "
          f"replies {replies.hexdigest()[:12]}, data {data[1:13].decode() if data.startswith(b'+') else data[:12].decode()}")
    for line in stats.decode().splitlines():
        m = re.match(r"cmdstat_(\S+):calls=(\d+),usec=(\d+)", line)
        if m and m.group(1) not in ("set", "info", "config|resetstat", "fcall"):
            print(f"  {m.group(1):24} calls {int(m.group(2)):8}  usec {int(m.group(3)):8}")
    if a.by_function:
        print_by_function(a.callgrind, measured)
    elif a.callgrind:
        totals = subprocess.run(["callgrind_annotate", "--auto=no", a.callgrind], capture_output=True, text=True).stdout
        m = re.search(r"([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", totals)
        print(f"Ir {m.group(1) if m else '?'} ({a.callgrind})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("capture")
    c.add_argument("bench")
    c.add_argument("scenario")
    c.add_argument("dir")
    c.add_argument("--seconds", type=int, default=8)
    c.add_argument("--at", type=float, default=5.0)
    r = sub.add_parser("replay")
    r.add_argument("dir")
    r.add_argument("--lib")
    r.add_argument("--skip", type=int, default=0)
    r.add_argument("--callgrind")
    r.add_argument("--server", default="redis-server")
    r.add_argument("--commands", action="store_true")
    r.add_argument("--fresh-summaries", action="store_true")
    r.add_argument("--by-function", action="store_true")
    r.add_argument("--cold", type=int, default=0, metavar="MB")
    a = ap.parse_args()
    capture(a) if a.what == "capture" else replay(a)


if __name__ == "__main__":
    main()
