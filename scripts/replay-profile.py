#!/usr/bin/env python3
"""Deterministic profiles of the Lua library on captured traffic.

A steady load's Redis CPU per job varies +-10 % between runs on a shared
host, which hides most single changes. This tool takes that noise away:

  capture BENCH SCENARIO DIR [--seconds S]
      Runs one benchmark scenario (BENCH is the bench binary,
      `target/release/deps/bench-<hash>`), and 5 s into it snapshots its
      Redis (CLIENT PAUSE, a marker, SAVE) and records S seconds of MONITOR
      after the snapshot. DIR gets dump.rdb, monitor.txt and lib.lua (the
      Functions library the daemon loaded).

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

Loopback only; the replay's Redis is killed at the end.
"""
import argparse
import hashlib
import os
import re
import shutil
import socket
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
    time.sleep(5)
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


def replay(a):
    calls = captured_calls(os.path.join(a.dir, "monitor.txt"))
    with open(a.lib or os.path.join(a.dir, "lib.lua"), "rb") as lib:
        code = replay_library(lib.read())
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
    server = subprocess.Popen(command, stdout=open(os.path.join(work, "log"), "w"), stderr=subprocess.STDOUT)
    try:
        redis = Conn(port)
        while b"loading:0" not in redis.call("INFO", "persistence"):
            time.sleep(0.1)
        loaded = redis.call("FUNCTION", "LOAD", "REPLACE", code)
        if loaded.startswith(b"-"):
            sys.exit(loaded.decode())

        def fcall_stats():
            m = re.search(rb"cmdstat_fcall:calls=(\d+),usec=(\d+)", redis.call("INFO", "commandstats"))
            return (int(m.group(1)), int(m.group(2))) if m else (0, 0)

        replies, errors, first = hashlib.sha1(), 0, fcall_stats()
        for i, (ms, args) in enumerate(calls):
            if i == a.skip and a.skip and a.callgrind:
                subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True)
            if i == a.skip:
                first = fcall_stats()
            redis.call("SET", "hqnow", ms)
            name = re.sub(rb"^hookq_[0-9a-f]+", b"hqreplay", args[1])
            reply = redis.call(args[0], name, *args[2:])
            errors += isinstance(reply, bytes) and reply.startswith(b"-")
            replies.update(repr(reply).encode())
        last = fcall_stats()
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
    measured = last[0] - first[0]
    print(f"calls {measured} (of {len(calls)}), errors {errors}, FCALL us {last[1] - first[1]}, "
          f"replies {replies.hexdigest()[:12]}, data {data[1:13].decode() if data.startswith(b'+') else data[:12].decode()}")
    if a.callgrind:
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
    r = sub.add_parser("replay")
    r.add_argument("dir")
    r.add_argument("--lib")
    r.add_argument("--skip", type=int, default=0)
    r.add_argument("--callgrind")
    r.add_argument("--server", default="redis-server")
    a = ap.parse_args()
    capture(a) if a.what == "capture" else replay(a)


if __name__ == "__main__":
    main()
