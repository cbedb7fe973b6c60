// BullMQ as a peer of hookq for benches/bench/peers.rs (`--peers`): the one-host
// shape of `one_host_default` and the steady shape of `steady_200`, on the
// same Redis and the same nginx receiver.
//
//   node bullmq.js REDIS_URL TARGET_URL N CONCURRENCY LEAD_MS [STEP_MS]
//
// 1. adds N delayed jobs all due at one moment (now + LEAD_MS), or with
//    STEP_MS job i due at now + LEAD_MS + i * STEP_MS (a steady pace), with
//    `queue.addBulk` in chunks of 1,000 (`delay` is relative, so each chunk's
//    delay is computed against the clock just before it is sent);
// 2. starts one Worker with CONCURRENCY whose processor POSTs the job's data
//    as a small JSON body to TARGET_URL through a keep-alive http.Agent
//    (one socket per concurrent job at most), to TARGET_URL's path with
//    `?due=<the job's due ms>` (nginx's log then shows each answer's
//    lateness); a non-2xx answer fails the job;
// 3. prints one JSON line per event on stdout:
//    {"event":"ready","due":ms,"now":ms} once the jobs are added and the
//    worker runs (the bench starts measuring CPU there), then
//    {"event":"done","count":N,"first_ms":ms,"last_ms":ms} when N POSTs have
//    had a 2xx (times are wall-clock ms of the answers, as seen here);
// 4. closes the worker and the queue and exits on SIGTERM, or at once if its
//    parent (the bench) is gone, so that it never outlives a killed bench.
//
// Everything else is BullMQ's default (no removeOnComplete: completed jobs are
// kept, as a default install does).
"use strict";

const http = require("node:http");
const { Queue, Worker } = require("bullmq");

const [redisUrl, targetUrl, nArg, concurrencyArg, leadArg, stepArg] = process.argv.slice(2);
const n = Number(nArg);
const concurrency = Number(concurrencyArg);
const lead = Number(leadArg);
const step = Number(stepArg || 0);
if (!redisUrl || !targetUrl || !(n > 0) || !(concurrency > 0) || !(lead > 0) || !(step >= 0)) {
  console.error("usage: node bullmq.js REDIS_URL TARGET_URL N CONCURRENCY LEAD_MS [STEP_MS]");
  process.exit(2);
}

const redis = new URL(redisUrl);
const connection = {
  host: redis.hostname,
  port: Number(redis.port || 6379),
  db: Number((redis.pathname || "/0").slice(1) || 0),
  // A Worker's blocking connection requires it.
  maxRetriesPerRequest: null,
};
const target = new URL(targetUrl);
const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });

function emit(event) {
  process.stdout.write(JSON.stringify(event) + "\n");
}

function post(body, due) {
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: target.hostname,
        port: target.port,
        path: `${target.pathname}?due=${due}`,
        method: "POST",
        agent,
        headers: {
          "content-type": "application/json",
          "content-length": Buffer.byteLength(body),
        },
      },
      (res) => {
        res.resume();
        res.on("end", () => {
          if (res.statusCode >= 200 && res.statusCode < 300) {
            resolve(res.statusCode);
          } else {
            reject(new Error(`${targetUrl} answered ${res.statusCode}`));
          }
        });
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

async function main() {
  // Orphaned (the bench was killed without its cleanup): exit.
  const parent = process.ppid;
  setInterval(() => {
    if (process.ppid !== parent) process.exit(1);
  }, 1000).unref();
  const queue = new Queue("bench", { connection });
  await queue.waitUntilReady();
  const due = Date.now() + lead;
  for (let start = 0; start < n; start += 1000) {
    const now = Date.now();
    const jobs = [];
    for (let i = start; i < Math.min(n, start + 1000); i++) {
      const at = due + Math.floor(i * step);
      jobs.push({ name: "hook", data: { due: at, i }, opts: { delay: Math.max(0, at - now) } });
    }
    await queue.addBulk(jobs);
  }

  let count = 0;
  let firstMs = 0;
  let lastMs = 0;
  const worker = new Worker(
    "bench",
    async (job) => {
      await post(JSON.stringify(job.data), job.data.due);
      const at = Date.now();
      count += 1;
      if (firstMs === 0) firstMs = at;
      lastMs = at;
      if (count === n) {
        emit({ event: "done", count, first_ms: firstMs, last_ms: lastMs });
      }
    },
    { connection, concurrency },
  );
  worker.on("error", (e) => console.error("worker error:", e));
  await worker.waitUntilReady();
  const now = Date.now();
  if (now >= due) {
    console.error(`adding ${n} jobs took longer than the lead of ${lead} ms`);
    process.exit(1);
  }
  emit({ event: "ready", due, now });

  let closing = false;
  const close = async () => {
    if (closing) return;
    closing = true;
    await worker.close(true);
    await queue.close();
    agent.destroy();
    process.exit(0);
  };
  process.on("SIGTERM", close);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
