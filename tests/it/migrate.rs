//! Layout versions and `hookq migrate`: a daemon or a data command refuses
//! data of another layout (naming the migration), and the migration converts
//! layout-1 records (one hash per job) in place, resuming after `kill -9`.
//!
//! Layout-1 data is written here by hand, field by field, as the layout-1
//! scripts wrote it (the job hash's fields `job`, `state`, `att`, `max`,
//! `due`, `seq`, `lease`, `ct`, `ut`, `dl`, `park`); the sets, lists, streams
//! and counters around it are the same in both layouts.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use hookq::job::{now_ms, State};
use hookq::store::keys::Keys;
use hookq::store::record::RecordHeader;
use hookq::store::Store;
use redis::AsyncCommands;

use crate::ops::{free_port, spawn_serve};
use crate::support::receiver::Receiver;
use crate::support::redis::RedisServer;
use crate::support::wait_until;
use crate::{get_json, start_daemon, test_config};

const BIN: &str = env!("CARGO_BIN_EXE_hookq");
const NS: &str = "hookq";
/// How long one CLI run may take before the test fails.
const CLI_DEADLINE: Duration = Duration::from_secs(120);
/// How long a refused `hookq serve` may take to exit.
const REFUSE_DEADLINE: Duration = Duration::from_secs(30);

/// `hookq <args>` against `redis` (namespace `hookq`, `partitions`
/// partitions), not yet started.
fn hookq_command(redis: &RedisServer, partitions: u16, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("HOOKQ_REDIS__URL", redis.url())
        .env("HOOKQ_REDIS__NAMESPACE", NS)
        .env("HOOKQ_REDIS__PARTITIONS", partitions.to_string())
        .env("HOOKQ_DELIVERY__ALLOW_PRIVATE", "true")
        .env("HOOKQ_LOG__LEVEL", "warn")
        .env_remove("HOOKQ_CONFIG");
    command
}

/// Runs `hookq <args>` to its end (panics after `CLI_DEADLINE`).
pub(crate) fn hookq(redis: &RedisServer, partitions: u16, args: &[&str]) -> Output {
    crate::output_within(hookq_command(redis, partitions, args), CLI_DEADLINE)
}

fn spec(url: &str, n: usize) -> String {
    format!(r#"{{"url":"{url}","body":{{"n":{n}}}}}"#)
}

/// Runs `hookq --json migrate` on `partitions` partitions, which must
/// succeed; its JSON report.
fn migrate_report(redis: &RedisServer, partitions: u16) -> serde_json::Value {
    let out = hookq(redis, partitions, &["--json", "migrate"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

/// Creates job `id`, due in an hour, with `hookq enqueue` on 4 partitions.
fn enqueue_in_an_hour(redis: &RedisServer, id: &str) {
    let out = hookq(
        redis,
        4,
        &[
            "enqueue",
            "--url",
            "http://127.0.0.1:9/hook",
            "--delay",
            "1h",
            "--id",
            id,
        ],
    );
    assert!(
        out.status.success(),
        "hookq enqueue: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn schema(conn: &mut redis::aio::MultiplexedConnection) -> Option<String> {
    conn.get(format!("{NS}:schema")).await.expect("GET schema")
}

/// One layout-1 job hash, as the layout-1 scripts left it.
#[derive(Debug, Clone)]
struct L1Job {
    id: String,
    spec: Option<String>,
    state: &'static str,
    att: u32,
    max: u32,
    due: i64,
    seq: Option<u64>,
    lease: Option<u64>,
    ct: i64,
    ut: i64,
    dl: Option<String>,
    park: Option<String>,
    ttl_ms: Option<u64>,
}

impl L1Job {
    fn new(id: String, spec: String, state: &'static str, due: i64, ct: i64) -> L1Job {
        L1Job {
            id,
            spec: Some(spec),
            state,
            att: 0,
            max: 3,
            due,
            seq: None,
            lease: None,
            ct,
            ut: ct,
            dl: None,
            park: None,
            ttl_ms: None,
        }
    }

    /// Adds the HSET (and PEXPIRE) of this job's hash to `pipe`.
    fn write(&self, keys: &Keys, pipe: &mut redis::Pipeline) {
        let key = keys.job(keys.partition_of(&self.id), &self.id);
        let mut fields: Vec<(&str, String)> = vec![
            ("state", self.state.to_string()),
            ("att", self.att.to_string()),
            ("max", self.max.to_string()),
            ("due", self.due.to_string()),
            ("ct", self.ct.to_string()),
            ("ut", self.ut.to_string()),
        ];
        if let Some(spec) = &self.spec {
            fields.push(("job", spec.clone()));
        }
        if let Some(seq) = self.seq {
            fields.push(("seq", format!("{seq:012x}")));
        }
        if let Some(lease) = self.lease {
            fields.push(("lease", lease.to_string()));
        }
        if let Some(dl) = &self.dl {
            fields.push(("dl", dl.clone()));
        }
        if let Some(park) = &self.park {
            fields.push(("park", park.clone()));
        }
        pipe.hset_multiple(&key, &fields).ignore();
        if let Some(ttl) = self.ttl_ms {
            pipe.pexpire(&key, ttl as i64).ignore();
        }
    }

    /// The state a converted record of this job reads as: a scheduled job
    /// whose time has come reads as ready.
    fn expected_state(&self) -> State {
        match State::parse(self.state).expect("a layout-1 state name") {
            State::Scheduled if self.due <= now_ms() => State::Ready,
            state => state,
        }
    }
}

/// A daemon and a data command refuse the data in `redis` (4 partitions)
/// naming `hookq migrate`, and change nothing in Redis.
async fn assert_refused(redis: &RedisServer, id: &str, what: &str) {
    let before = crate::redis_snapshot(redis).await;

    let port = free_port();
    let mut serve = spawn_serve(redis, port, &[]);
    let status = serve.wait_exit(REFUSE_DEADLINE).await;
    let log = serve.log();
    assert!(
        !status.success(),
        "hookq serve started on {what} ({status}); log:\n{log}"
    );
    assert!(
        log.contains("hookq migrate"),
        "hookq serve's refusal on {what} does not name `hookq migrate`:\n{log}"
    );

    let out = hookq(redis, 4, &["show", id]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "hookq show {id} succeeded on {what}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains("hookq migrate"),
        "hookq show's refusal on {what} does not name `hookq migrate`: {stderr}"
    );

    assert!(
        crate::redis_snapshot(redis).await == before,
        "a refused start or command changed Redis ({what})"
    );
}

// Multi-threaded: the CLI runs are waited for on this thread while the
// in-process daemon keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_refuses_data_of_another_layout_naming_migrate() {
    // A Redis without hookq data: the daemon starts and writes its layout.
    let fresh = RedisServer::start();
    let mut conn = fresh.conn().await;
    assert_eq!(schema(&mut conn).await, None);
    let daemon = start_daemon(&test_config(&fresh)).await;
    assert_eq!(schema(&mut conn).await.as_deref(), Some("6"));
    // While a daemon runs (subscribed to the wake channel), the migration
    // refuses to start.
    wait_until(
        "the daemon is subscribed to the wake channel",
        Duration::from_secs(15),
        || async {
            let mut conn = fresh.conn().await;
            let (_, n): (String, u64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(format!("{NS}:wake"))
                .query_async(&mut conn)
                .await
                .expect("PUBSUB NUMSUB");
            n > 0
        },
    )
    .await;
    let out = hookq(&fresh, 4, &["migrate"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("stop every hookq daemon"),
        "hookq migrate beside a running daemon: {}: {stderr}",
        out.status
    );
    daemon.stop().await.expect("clean stop");

    // A Redis with layout-1 data (no schema key): a scheduled job in the due
    // set with its sequence counter, a ready job, a delivered one.
    let old = RedisServer::start();
    // (Layout 1 kept each partition's timers in the partition.)
    let keys = Keys::in_cluster(NS, 4);
    let now = now_ms();
    let url = "http://127.0.0.1:9/hook";
    let mut scheduled = L1Job::new(
        "old-s".into(),
        spec(url, 1),
        "scheduled",
        now + 3_600_000,
        now,
    );
    scheduled.seq = Some(1);
    let ready = L1Job::new("old-r".into(), spec(url, 2), "ready", now, now);
    let mut delivered = L1Job::new("old-d".into(), spec(url, 3), "delivered", now, now);
    delivered.att = 1;
    delivered.ttl_ms = Some(3_600_000);
    let mut pipe = redis::pipe();
    for job in [&scheduled, &ready, &delivered] {
        job.write(&keys, &mut pipe);
    }
    let ps = keys.partition_of("old-s");
    pipe.zadd(keys.due(ps), format!("{:012x}old-s", 1), now + 3_600_000)
        .ignore()
        .set(keys.seq(ps), 1)
        .ignore()
        .rpush(keys.ready(keys.partition_of("old-r")), "old-r")
        .ignore()
        .hset(keys.stats(keys.partition_of("old-d")), "delivered", 1)
        .ignore();
    let mut conn = old.conn().await;
    let () = pipe.query_async(&mut conn).await.expect("seed layout 1");

    assert_refused(&old, "old-s", "layout-1 data without a schema key").await;
    assert_eq!(schema(&mut conn).await, None, "the refusal wrote a version");

    // An interrupted migration: the same.
    let () = conn.set(format!("{NS}:schema"), "1>2").await.expect("SET");
    assert_refused(&old, "old-s", "schema `1>2`").await;
    assert_eq!(schema(&mut conn).await.as_deref(), Some("1>2"));
}

/// A daemon and a data command configured with another partition count
/// than the namespace's data was written with refuse, naming
/// `redis.partitions` and the count to set, and change nothing; `hookq
/// doctor` says the same. (A job lives in the partition its id hashes to:
/// with another count its partition would never be claimed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_partition_count_is_refused_naming_the_config_key() {
    let redis = RedisServer::start();
    let mut conn = redis.conn().await;
    // The first command on a fresh namespace records its count.
    enqueue_in_an_hour(&redis, "parted");
    let recorded: Option<String> = conn.get(format!("{NS}:partitions")).await.expect("GET");
    assert_eq!(recorded.as_deref(), Some("4"));

    let before = crate::redis_snapshot(&redis).await;
    let out = hookq(&redis, 8, &["show", "parted"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "hookq show with 8 partitions: {stderr}"
    );
    assert!(
        stderr.contains("`redis.partitions` is 8") && stderr.contains("redis.partitions = 4"),
        "the refusal does not name the key and the count to set: {stderr}"
    );

    let port = free_port();
    let mut serve = spawn_serve(&redis, port, &[("HOOKQ_REDIS__PARTITIONS", "8")]);
    let status = serve.wait_exit(REFUSE_DEADLINE).await;
    let log = serve.log();
    assert!(
        !status.success(),
        "hookq serve started with 8 partitions; log:\n{log}"
    );
    assert!(
        log.contains("redis.partitions = 4"),
        "hookq serve's refusal does not name the count to set:\n{log}"
    );

    let out = hookq(&redis, 8, &["doctor"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(5),
        "hookq doctor with 8 partitions: {stdout}"
    );
    assert!(
        stdout.contains("redis.partitions = 4"),
        "hookq doctor does not name the count to set: {stdout}"
    );
    assert!(
        crate::redis_snapshot(&redis).await == before,
        "a refused start or command changed Redis"
    );

    // The recorded count works as before.
    let out = hookq(&redis, 4, &["show", "parted"]);
    assert!(
        out.status.success(),
        "hookq show with 4 partitions: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A child process with piped stderr in its own process group, killed with
/// its group when dropped (a failing test leaves nothing running).
struct PipedChild(std::process::Child);

impl Drop for PipedChild {
    fn drop(&mut self) {
        crate::support::kill_process_group(self.0.id());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `hookq migrate` and SIGKILLs it as soon as its stderr says the first
/// partition is done; returns the stderr lines it printed.
fn migrate_killed_after_first_partition(redis: &RedisServer, partitions: u16) -> Vec<String> {
    let mut command = hookq_command(redis, partitions, &["migrate"]);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = PipedChild(command.spawn().expect("hookq migrate starts"));
    let stderr = child.0.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let marker = format!("partition 1/{partitions} done");
    let until = Instant::now() + CLI_DEADLINE;
    let mut lines = Vec::new();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let done = line.contains(&marker);
                lines.push(line);
                if done {
                    child.0.kill().expect("kill -9 hookq migrate");
                    let _ = child.0.wait();
                    return lines;
                }
            }
            Err(e) => panic!(
                "hookq migrate never printed `{marker}` ({e:?}); its stderr:\n{}",
                lines.join("\n")
            ),
        }
    }
}

/// Every key matching `pattern`, by SCAN.
async fn scan_keys(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(10_000)
            .query_async(conn)
            .await
            .expect("SCAN");
        out.extend(keys);
        if next == 0 {
            return out;
        }
        cursor = next;
    }
}

/// How many job keys of each Redis type.
async fn job_key_types(conn: &mut redis::aio::MultiplexedConnection) -> BTreeMap<String, usize> {
    let keys: HashSet<String> = scan_keys(conn, &format!("{NS}:*:job:*"))
        .await
        .into_iter()
        .collect();
    let keys: Vec<String> = keys.into_iter().collect();
    let mut types = BTreeMap::new();
    for chunk in keys.chunks(20_000) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.cmd("TYPE").arg(key);
        }
        let found: Vec<String> = pipe.query_async(conn).await.expect("TYPE");
        for t in found {
            *types.entry(t).or_insert(0) += 1;
        }
    }
    types
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_converts_layout_1_in_place_and_resumes_after_kill_9() {
    const PARTITIONS: u16 = 16;
    const FAR: usize = 100_000;
    const EACH: usize = 3;
    let started = Instant::now();
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let keys = Keys::new(NS, PARTITIONS);
    // Layout 1 kept each partition's due set in the partition.
    let own_timers = Keys::in_cluster(NS, PARTITIONS);
    let mut conn = redis.conn().await;
    let now = now_ms();
    let far_due = now + 7 * 24 * 3_600_000;
    let created = now - 60_000;
    let parked_host = "http://127.0.0.1:9".to_string();

    // The jobs, by kind. Sequences are per partition, as the scripts kept them.
    let mut seqs = vec![0u64; PARTITIONS as usize];
    let mut next_seq = |id: &str| {
        let s = &mut seqs[keys.partition_of(id) as usize];
        *s += 1;
        *s
    };
    let mut jobs: Vec<L1Job> = Vec::with_capacity(FAR + 8 * EACH);
    for i in 0..FAR {
        let id = format!("far-{i:06}");
        let mut job = L1Job::new(
            id.clone(),
            spec("http://127.0.0.1:9/far", i),
            "scheduled",
            far_due + i as i64,
            created + (i % 1000) as i64,
        );
        job.seq = Some(next_seq(&id));
        jobs.push(job);
    }
    let mut kinds: HashMap<&'static str, Vec<String>> = HashMap::new();
    for k in 0..EACH {
        let mut add = |kind: &'static str, job: L1Job| {
            kinds.entry(kind).or_default().push(job.id.clone());
            jobs.push(job);
        };
        let id = format!("ready-{k}");
        let mut job = L1Job::new(
            id.clone(),
            spec(&receiver.url("/ready"), k),
            "ready",
            now - 2_000,
            created,
        );
        // Promotion left the due-set sequence on the hash.
        job.seq = Some(next_seq(&id));
        add("ready", job);

        let id = format!("soon-{k}");
        let mut job = L1Job::new(
            id.clone(),
            spec(&receiver.url("/soon"), k),
            "scheduled",
            now + 1_000,
            created,
        );
        job.seq = Some(next_seq(&id));
        add("soon", job);

        let mut job = L1Job::new(
            format!("inflight-{k}"),
            spec(&receiver.url("/inflight"), k),
            "inflight",
            now - 10_000,
            created,
        );
        job.att = 1;
        job.lease = Some(5_000);
        add("inflight", job);

        let mut job = L1Job::new(
            format!("parked-{k}"),
            spec("http://127.0.0.1:9/parked", k),
            "scheduled",
            far_due,
            created,
        );
        job.park = Some(parked_host.clone());
        add("parked", job);

        let mut job = L1Job::new(
            format!("delivered-{k}"),
            spec("http://127.0.0.1:9/delivered", k),
            "delivered",
            now - 30_000,
            created,
        );
        job.att = 1;
        job.ttl_ms = Some(3_600_000);
        add("delivered", job);

        let mut job = L1Job::new(
            format!("cancelled-{k}"),
            spec("http://127.0.0.1:9/cancelled", k),
            "cancelled",
            far_due,
            created,
        );
        job.ttl_ms = Some(3_600_000);
        add("cancelled", job);

        let mut job = L1Job::new(
            format!("dead-{k}"),
            spec("http://127.0.0.1:9/dead", k),
            "dead",
            now - 20_000,
            created,
        );
        job.att = 3;
        job.ttl_ms = Some(3_600_000);
        add("dead", job);
    }
    // The dead letters, real stream entries (their ids go into `dl`).
    for job in jobs.iter_mut().filter(|j| j.state == "dead") {
        let entry: String = redis::cmd("XADD")
            .arg(keys.dead(keys.partition_of(&job.id)))
            .arg("*")
            .arg("id")
            .arg(&job.id)
            .arg("topic")
            .arg("default")
            .arg("attempts")
            .arg(job.att)
            .arg("last_error")
            .arg("http_status: 410 Gone")
            .arg("last_status")
            .arg(410)
            .arg("job")
            .arg(job.spec.as_deref().expect("a spec"))
            .arg("dead_at")
            .arg(now - 20_000)
            .query_async(&mut conn)
            .await
            .expect("XADD dead letter");
        job.dl = Some(entry);
    }
    let mut bare = L1Job::new(
        "bare-1".into(),
        String::new(),
        "scheduled",
        far_due,
        created,
    );
    bare.spec = None;

    // Write layout 1, in large pipelines.
    let seed_started = Instant::now();
    for chunk in jobs.chunks(10_000) {
        let mut pipe = redis::pipe();
        let mut due: HashMap<u16, Vec<(i64, String)>> = HashMap::new();
        for job in chunk {
            job.write(&keys, &mut pipe);
            let p = keys.partition_of(&job.id);
            if job.state == "scheduled" && job.park.is_none() {
                let seq = job.seq.expect("scheduled job has a seq");
                due.entry(p)
                    .or_default()
                    .push((job.due, format!("{seq:012x}{}", job.id)));
            } else if job.state == "ready" {
                pipe.rpush(keys.ready(p), &job.id).ignore();
            } else if job.state == "inflight" {
                // The lease ran out a second ago: its daemon died.
                pipe.zadd(keys.inflight(p), &job.id, now - 1_000).ignore();
            } else if let Some(host) = &job.park {
                pipe.zadd(keys.park(p, host), &job.id, job.due)
                    .ignore()
                    .sadd(keys.parked_hosts(p), host)
                    .ignore();
            }
        }
        for (p, members) in due {
            let items: Vec<(i64, String)> = members;
            pipe.zadd_multiple(own_timers.due(p), &items).ignore();
        }
        let () = pipe.query_async(&mut conn).await.expect("seed layout 1");
    }
    let mut pipe = redis::pipe();
    bare.write(&keys, &mut pipe);
    for (p, seq) in seqs.iter().enumerate() {
        pipe.set(keys.seq(p as u16), *seq).ignore();
        pipe.hset(keys.stats(p as u16), "delivered", 1).ignore();
    }
    let () = pipe.query_async(&mut conn).await.expect("seed layout 1");
    let seeded = job_key_types(&mut conn).await;
    assert_eq!(
        seeded.get("hash").copied(),
        Some(jobs.len() + 1),
        "seeded job hashes: {seeded:?}"
    );
    eprintln!(
        "seeded {} layout-1 jobs in {:?}",
        jobs.len() + 1,
        seed_started.elapsed()
    );

    // Interrupted: kill -9 right after the first partition.
    let lines = migrate_killed_after_first_partition(&redis, PARTITIONS);
    let version = schema(&mut conn).await;
    assert_ne!(
        version.as_deref(),
        Some("6"),
        "hookq migrate finished before it was killed (the kill came too late to test a \
         resume); stderr: {lines:?}"
    );
    assert_eq!(
        version.as_deref(),
        Some("1>6"),
        "schema after a killed migration"
    );
    let halfway = job_key_types(&mut conn).await;
    let unconverted = halfway.get("hash").copied().unwrap_or(0);
    assert!(
        unconverted > 0 && unconverted < jobs.len() + 1,
        "a migration killed after partition 1 should leave both layouts: {halfway:?}"
    );

    let port = free_port();
    let mut serve = spawn_serve(
        &redis,
        port,
        &[("HOOKQ_REDIS__PARTITIONS", &PARTITIONS.to_string())],
    );
    let status = serve.wait_exit(REFUSE_DEADLINE).await;
    let log = serve.log();
    assert!(
        !status.success() && log.contains("hookq migrate"),
        "hookq serve on a half-migrated Redis: {status}, log:\n{log}"
    );
    drop(serve);

    // Run again, to the end.
    let migrate_started = Instant::now();
    let out = hookq(&redis, PARTITIONS, &["--json", "migrate"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "hookq migrate failed: {stderr}");
    eprintln!("resumed migration took {:?}", migrate_started.elapsed());
    for p in 1..=PARTITIONS {
        assert!(
            stderr.contains(&format!("partition {p}/{PARTITIONS} done")),
            "no progress line for partition {p}: {stderr}"
        );
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(report["schema"], "6", "{report}");
    let converted = report["converted"].as_u64().expect("converted");
    let already = report["already_converted"].as_u64().expect("already");
    assert!(
        already > 0 && converted > 0 && converted < jobs.len() as u64 + 1,
        "the second run should resume, not start over: {report}"
    );
    assert_eq!(schema(&mut conn).await.as_deref(), Some("6"));

    // Finished jobs are kept as record strings, live ones moved into the
    // record hashes; the bare hash is gone.
    let types = job_key_types(&mut conn).await;
    assert_eq!(
        types,
        BTreeMap::from([("string".to_string(), 3 * EACH)]),
        "job key types after the migration"
    );
    let bare_key = keys.job(keys.partition_of("bare-1"), "bare-1");
    let bare_left: bool = conn.exists(&bare_key).await.expect("EXISTS");
    assert!(!bare_left, "the bare hash {bare_key} is still there");

    // Each record reads back as the layout-1 hash said.
    let mut config = test_config(&redis);
    config.redis.partitions = PARTITIONS;
    config.redis.namespace = NS.into();
    let store = Store::connect(&config).await.expect("connect a store");
    let records: Vec<_> = stream::iter(jobs.iter())
        .map(|job| {
            let store = store.clone();
            async move { (job, store.get(&job.id).await) }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    for (job, record) in records {
        let record = record
            .unwrap_or_else(|e| panic!("{}: {e}", job.id))
            .unwrap_or_else(|| panic!("{}: no record after the migration", job.id));
        assert_eq!(record.state, job.expected_state(), "{}", job.id);
        assert_eq!(record.attempts, job.att, "{}: attempts", job.id);
        assert_eq!(record.max_attempts, job.max, "{}: max attempts", job.id);
        assert_eq!(record.due, job.due, "{}: due", job.id);
        assert_eq!(record.created, job.ct, "{}: created", job.id);
        assert_eq!(
            Some(&record.spec_json),
            job.spec.as_ref(),
            "{}: spec",
            job.id
        );
        *by_state
            .entry(format!("{:?}", record.state).to_lowercase())
            .or_insert(0) += 1;
    }
    // The soon-due jobs (due a second after seeding began, which alone
    // takes longer) read as ready by now.
    let expected_counts = BTreeMap::from([
        ("cancelled".to_string(), EACH),
        ("dead".to_string(), EACH),
        ("delivered".to_string(), EACH),
        ("inflight".to_string(), EACH),
        ("ready".to_string(), 2 * EACH),
        ("scheduled".to_string(), FAR + EACH),
    ]);
    assert_eq!(by_state, expected_counts, "records by state");

    // Headers: scheduled jobs keep their due-set sequence, and every one of
    // them still has its due-set member; parked jobs got a parking sequence.
    // (In the shared timers now; every partition's own due set gone.)
    let due_members: HashSet<String> = conn.zrange(keys.due(0), 0, -1).await.expect("ZRANGE due");
    for p in 0..PARTITIONS {
        let left: bool = conn.exists(own_timers.due(p)).await.expect("EXISTS");
        assert!(!left, "partition {p}'s own due set is left");
    }
    let scheduled: Vec<&L1Job> = jobs
        .iter()
        .filter(|j| j.state == "scheduled" && j.park.is_none())
        .collect();
    for chunk in scheduled.chunks(20_000) {
        let mut pipe = redis::pipe();
        for job in chunk {
            pipe.hget(
                keys.live_records(keys.partition_of(&job.id), &job.id),
                &job.id,
            );
        }
        let headers: Vec<Vec<u8>> = pipe.query_async(&mut conn).await.expect("HGET");
        for (job, header) in chunk.iter().zip(headers) {
            let h = RecordHeader::parse(&header)
                .unwrap_or_else(|| panic!("{}: no record header", job.id));
            let seq = job.seq.expect("seq");
            assert!(!h.parked, "{} reads as parked", job.id);
            assert_eq!(h.seq, seq, "{}: due-set sequence", job.id);
            assert!(
                due_members.contains(&keys.due_member(keys.partition_of(&job.id), seq, &job.id)),
                "{} has no due-set member",
                job.id
            );
        }
    }
    assert_eq!(due_members.len(), scheduled.len(), "due-set members");

    for id in &kinds["parked"] {
        let p = keys.partition_of(id);
        let header: Vec<u8> = conn.hget(keys.live_records(p, id), id).await.expect("HGET");
        let h = RecordHeader::parse(&header).expect("parked record header");
        assert!(h.parked && h.state == State::Scheduled, "{id}: {h:?}");
        assert!(h.seq > 0, "{id} has no parking sequence: {h:?}");
        let members: Vec<String> = conn
            .zrange(keys.park(p, &parked_host), 0, -1)
            .await
            .expect("ZRANGE park");
        let mine: Vec<&String> = members
            .iter()
            .filter(|m| m.ends_with(id.as_str()))
            .collect();
        assert_eq!(
            mine,
            vec![&format!("{:012x}{id}", h.seq)],
            "{id}: parking members {members:?}"
        );
        let parked: bool = conn
            .sismember(keys.parked_hosts(p), &parked_host)
            .await
            .expect("SISMEMBER");
        assert!(parked, "{id}: its host left the parked-hosts set");
        let due_seq: u64 = conn.get(keys.seq(p)).await.expect("GET seq");
        assert!(
            h.seq <= due_seq,
            "{id}: parking sequence {} beyond the counter {due_seq}",
            h.seq
        );
    }

    // Finished records keep their time to live.
    for kind in ["delivered", "cancelled", "dead"] {
        for id in &kinds[kind] {
            let ttl: i64 = conn
                .pttl(keys.job(keys.partition_of(id), id))
                .await
                .expect("PTTL");
            assert!(ttl > 0, "{id} lost its TTL ({ttl})");
        }
    }
    // Dead jobs point at their dead letters.
    for job in jobs.iter().filter(|j| j.state == "dead") {
        let dl = job.dl.as_deref().expect("dl");
        let header: Vec<u8> = conn
            .getrange(keys.job(keys.partition_of(&job.id), &job.id), 0, 38)
            .await
            .expect("GETRANGE");
        let h = RecordHeader::parse(&header).expect("dead record header");
        assert_eq!(h.dead_letter_entry().as_deref(), Some(dl), "{}", job.id);
        let found = store
            .find_dead(&job.id)
            .await
            .expect("find_dead")
            .unwrap_or_else(|| panic!("{}: no dead letter found", job.id));
        assert_eq!(found.entry_id, dl, "{}", job.id);
        assert_eq!(found.id, job.id);
    }

    // A daemon on the migrated data delivers what was due, once each.
    let daemon = start_daemon(&config).await;
    let base = daemon.url();
    let due_now: Vec<String> = ["ready", "soon", "inflight"]
        .iter()
        .flat_map(|k| kinds[k].iter().cloned())
        .collect();
    wait_until(
        "the ready, soon-due and expired-lease jobs are delivered",
        Duration::from_secs(30),
        || async {
            for id in &due_now {
                match store.get(id).await {
                    Ok(Some(r)) if r.state == State::Delivered => {}
                    _ => return false,
                }
            }
            true
        },
    )
    .await;
    let (status, view) = get_json(&format!("{base}/v1/jobs/far-000042")).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["state"], "scheduled", "{view}");
    assert_eq!(view["body"], serde_json::json!({"n": 42}), "{view}");
    daemon.stop().await.expect("clean stop");

    let mut per_id: HashMap<String, Vec<String>> = HashMap::new();
    for r in receiver.requests() {
        let id = r.header("webhook-id").unwrap_or("?").to_string();
        per_id.entry(id).or_default().push(r.path.clone());
    }
    for kind in ["ready", "soon", "inflight"] {
        for id in &kinds[kind] {
            assert_eq!(
                per_id.get(id),
                Some(&vec![format!("/{kind}")]),
                "{id} should be delivered exactly once"
            );
        }
    }
    assert_eq!(
        per_id.len(),
        due_now.len(),
        "unexpected deliveries: {per_id:?}"
    );
    let inflight = store
        .get(&kinds["inflight"][0])
        .await
        .expect("get")
        .expect("record");
    assert_eq!(inflight.attempts, 2, "the lost attempt and the delivery");
    eprintln!("migrate test took {:?}", started.elapsed());
}

/// A layout-2 record: the 33-byte header of layout 2, then the spec JSON.
fn layout2_record(state: u8, due: i64, seq: u64, created: i64, spec: &str) -> Vec<u8> {
    let mut v = vec![state];
    v.extend_from_slice(&(created as u64).to_be_bytes()[2..]);
    v.extend_from_slice(&0u16.to_be_bytes());
    v.extend_from_slice(&3u16.to_be_bytes());
    v.extend_from_slice(&(due as u64).to_be_bytes()[2..]);
    v.extend_from_slice(&seq.to_be_bytes()[2..]);
    v.extend_from_slice(&(created as u64).to_be_bytes()[2..]);
    v.extend_from_slice(&0u32.to_be_bytes());
    v.extend_from_slice(spec.as_bytes());
    v
}

/// Layout 2 (a string per job) converts to layout 3 (read by layout 4 as
/// it is): a scheduled job moves
/// into its record hash and is delivered on time by a daemon afterwards,
/// keeping the due time it was given; a finished record stays a string
/// with its time to live; a second run changes nothing.
#[tokio::test]
async fn migrate_converts_layout_2_records() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let partitions = 2;
    let keys = Keys::new(NS, partitions);
    let mut conn = redis.conn().await;
    let now = now_ms();
    let due = now + 1_500;
    let sched = "l2-sched";
    let p = keys.partition_of(sched);
    let spec = format!(r#"{{"url":"{}","delay_ms":1500}}"#, receiver.url("/l2"));
    let _: () = redis::pipe()
        .set(keys.job(p, sched), layout2_record(b's', due, 1, now, &spec))
        .zadd(
            Keys::in_cluster(NS, partitions).due(p),
            format!("{:012x}{sched}", 1),
            due,
        )
        .set(keys.seq(p), 1)
        .query_async(&mut conn)
        .await
        .expect("seed layout 2");
    let done = "l2-done";
    let q = keys.partition_of(done);
    let done_spec = r#"{"url":"http://127.0.0.1:9/","run_at":1700000000000}"#;
    let _: () = redis::pipe()
        .set(
            keys.job(q, done),
            layout2_record(b'd', now, 0, now, done_spec),
        )
        .pexpire(keys.job(q, done), 3_600_000)
        .set(format!("{NS}:schema"), "2")
        .query_async(&mut conn)
        .await
        .expect("seed layout 2");

    let out = hookq(&redis, partitions, &["--json", "migrate"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(schema(&mut conn).await.as_deref(), Some("6"));
    let (live, left): (bool, bool) = redis::pipe()
        .hexists(keys.live_records(p, sched), sched)
        .exists(keys.job(p, sched))
        .query_async(&mut conn)
        .await
        .expect("HEXISTS");
    assert_eq!((live, left), (true, false), "the scheduled record moved");
    let ttl: i64 = conn.pttl(keys.job(q, done)).await.expect("PTTL");
    assert!(
        ttl > 0,
        "the finished record keeps its time to live ({ttl})"
    );
    let again = hookq(&redis, partitions, &["--json", "migrate"]);
    assert!(again.status.success());

    let mut config = test_config(&redis);
    config.redis.partitions = partitions;
    let store = Store::connect(&config).await.expect("store");
    let finished = store.get(done).await.expect("get").expect("kept record");
    assert_eq!(finished.spec.run_at, Some(1_700_000_000_000));
    let scheduled = store.get(sched).await.expect("get").expect("live record");
    assert_eq!((scheduled.spec.delay_ms, scheduled.due), (Some(1_500), due));
    let daemon = start_daemon(&config).await;
    let got = receiver.wait_for_count(1, Duration::from_secs(10)).await;
    let received = got[0].received_ms();
    assert!(received >= due, "delivered {} ms early", due - received);
    assert_eq!(got[0].path, "/l2");
    daemon.stop().await.expect("clean stop");
}

/// Layout 3 migrates by its version alone. A daemon and a data command
/// refuse it, naming `hookq migrate`, which converts nothing. A job a
/// layout-3 daemon had claimed (its record says `i`, its counter at the
/// attempt in flight, as that daemon's claim wrote it) still reads as in
/// flight on that attempt; when its lease expires it is taken back (the
/// lost attempt counted) and delivered on attempt 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_3_migrates_by_its_version_and_its_claims_read_the_same() {
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let config = test_config(&redis);
    let store = Store::connect(&config).await.expect("store");
    let id = "l3-claimed";
    let input = hookq::job::JobInput {
        id: Some(id.into()),
        url: Some(receiver.url("/l3")),
        ..hookq::job::JobInput::default()
    };
    crate::enqueue_direct(&store, &config, input).await;
    let claimed = crate::claim_direct(&store, id).await;
    assert_eq!(claimed.attempt, 1);
    // As a layout-3 claim left it: the record in state `i`, attempt 1, and
    // a lease that expires soon.
    let keys = store.keys().clone();
    let p = keys.partition_of(id);
    let mut conn = redis.conn().await;
    let mut record: Vec<u8> = conn.hget(keys.live_records(p, id), id).await.expect("HGET");
    record[0] = b'i';
    record[7..9].copy_from_slice(&1u16.to_be_bytes());
    let _: () = redis::pipe()
        .hset(keys.live_records(p, id), id, record)
        .zadd(keys.inflight(p), id, now_ms() + 500)
        .set(format!("{NS}:schema"), "3")
        .query_async(&mut conn)
        .await
        .expect("write the layout-3 claim");

    assert_refused(&redis, id, "layout 3").await;
    let report = migrate_report(&redis, 4);
    assert_eq!(
        (&report["schema"], &report["converted"]),
        (&serde_json::json!("6"), &serde_json::json!(0)),
        "{report}"
    );
    assert_eq!(schema(&mut conn).await.as_deref(), Some("6"));
    let view = store.get(id).await.expect("get").expect("record");
    assert_eq!((view.state, view.attempts), (State::Inflight, 1));

    let daemon = start_daemon(&config).await;
    let got = receiver.wait_for_count(1, Duration::from_secs(15)).await;
    assert_eq!(got[0].header("hookq-attempt"), Some("2"), "{:?}", got[0]);
    daemon.stop().await.expect("clean stop");
}

/// Layout 4 kept each partition's timers (due sets, tenants' due sets and
/// their index, the wheel) in the partition; layout 5 on a single Redis
/// keeps every partition's in partition 0's. A daemon and a data command
/// refuse layout 4, naming `hookq migrate`, which moves every due-set
/// member, index entry and wheel id into the shared timers (a second run
/// changes nothing); a daemon then delivers the due jobs on time, and the
/// far ones wait in the shared wheel.
#[tokio::test]
async fn layout_4_timers_move_into_the_shared_timers() {
    const PARTITIONS: u16 = 8;
    let redis = RedisServer::start();
    let receiver = Receiver::ok().await;
    let (config, store) = crate::partitioned_store(&redis, PARTITIONS).await;
    let keys = store.keys().clone();
    let own = Keys::in_cluster(NS, PARTITIONS);

    // Jobs due in two seconds (the due sets, the default tenant's and
    // acme's), and a day ahead (the wheel).
    let due = now_ms() + 2_000;
    let mut soon = Vec::new();
    for i in 0..24 {
        let tenant = (i % 3 == 0).then(|| "acme".to_string());
        let input = hookq::job::JobInput {
            id: Some(format!("l4-soon-{i}")),
            url: Some(receiver.url("/soon")),
            run_at: Some(hookq::job::RunAt::Millis(due)),
            tenant: tenant.clone(),
            ..hookq::job::JobInput::default()
        };
        crate::enqueue_direct(&store, &config, input).await;
        soon.push(format!("l4-soon-{i}"));
    }
    for i in 0..16 {
        let input = hookq::job::JobInput {
            id: Some(format!("l4-far-{i}")),
            url: Some(receiver.url("/far")),
            delay: Some("1d".into()),
            ..hookq::job::JobInput::default()
        };
        crate::enqueue_direct(&store, &config, input).await;
    }

    // Written back as layout 4 kept them: each member, index entry and
    // wheel id in its job's own partition.
    let mut conn = redis.conn().await;
    let partition_of = |member: &str| keys.partition_of(member);
    let shared_due: Vec<(String, f64)> = conn
        .zrange_withscores(keys.due(0), 0, -1)
        .await
        .expect("ZRANGE");
    let acme_due: Vec<(String, f64)> = conn
        .zrange_withscores(keys.tenant_due(0, "acme"), 0, -1)
        .await
        .expect("ZRANGE");
    let index: Vec<(String, f64)> = conn
        .zrange_withscores(keys.due_tenants(0), 0, -1)
        .await
        .expect("ZRANGE");
    let buckets: Vec<(String, f64)> = conn
        .zrange_withscores(keys.wheel(0), 0, -1)
        .await
        .expect("ZRANGE");
    assert_eq!((shared_due.len(), acme_due.len()), (16, 8));
    assert_eq!(index.len(), 1, "acme in the index: {index:?}");
    assert!(!buckets.is_empty(), "the far jobs are in the wheel");
    let mut bucket_ids = Vec::new();
    for (slot, _) in &buckets {
        let ids: Vec<String> = conn
            .lrange(format!("{}:{slot}", keys.wheel(0)), 0, -1)
            .await
            .expect("LRANGE");
        bucket_ids.push(ids);
    }
    let mut pipe = redis::pipe();
    pipe.del(keys.due(0)).ignore();
    pipe.del(keys.tenant_due(0, "acme")).ignore();
    pipe.del(keys.due_tenants(0)).ignore();
    pipe.del(keys.wheel(0)).ignore();
    for (slot, _) in &buckets {
        pipe.del(format!("{}:{slot}", keys.wheel(0))).ignore();
    }
    // (A shared member is the sequence, the partition's tag (4 hex
    // digits) and the id; layout 4's had no tag.)
    let untagged = |member: &str| format!("{}{}", &member[..12], &member[16..]);
    for (member, score) in &shared_due {
        pipe.zadd(
            own.due(partition_of(&member[16..])),
            untagged(member),
            *score,
        )
        .ignore();
    }
    for (member, score) in &acme_due {
        let q = partition_of(&member[16..]);
        pipe.zadd(own.tenant_due(q, "acme"), untagged(member), *score)
            .ignore()
            .zadd(own.due_tenants(q), "acme", index[0].1)
            .ignore();
    }
    for ((slot, opens), entries) in buckets.iter().zip(&bucket_ids) {
        for entry in entries {
            // (A shared entry is the id after its partition's tag.)
            let id = &entry[4..];
            let q = partition_of(id);
            pipe.rpush(format!("{}:{slot}", own.wheel(q)), id)
                .ignore()
                .zadd(own.wheel(q), slot, *opens)
                .ignore();
        }
    }
    pipe.set(format!("{NS}:schema"), "4").ignore();
    let () = pipe.query_async(&mut conn).await.expect("write layout 4");
    let spread: HashSet<u16> = shared_due
        .iter()
        .map(|(m, _)| partition_of(&m[16..]))
        .collect();
    assert!(spread.len() > 1, "the jobs spread over partitions");

    assert_refused(&redis, "l4-soon-1", "layout 4").await;
    let report = migrate_report(&redis, PARTITIONS);
    assert_eq!(report["schema"], "6", "{report}");
    let moved = report["timers_moved"].as_u64().expect("timers_moved");
    assert!(moved >= 24, "members and ids moved: {report}");
    assert_eq!(schema(&mut conn).await.as_deref(), Some("6"));
    for p in 0..PARTITIONS {
        for key in [
            own.due(p),
            own.tenant_due(p, "acme"),
            own.due_tenants(p),
            own.wheel(p),
        ] {
            let left: bool = conn.exists(&key).await.expect("EXISTS");
            assert!(!left, "{key} is left");
        }
    }
    let back: Vec<(String, f64)> = conn
        .zrange_withscores(keys.due(0), 0, -1)
        .await
        .expect("ZRANGE");
    assert_eq!(back, shared_due, "the due set, scores and all");
    let back: Vec<(String, f64)> = conn
        .zrange_withscores(keys.tenant_due(0, "acme"), 0, -1)
        .await
        .expect("ZRANGE");
    assert_eq!(back, acme_due, "the tenant's due set");
    let back: Vec<(String, f64)> = conn
        .zrange_withscores(keys.wheel(0), 0, -1)
        .await
        .expect("ZRANGE");
    assert_eq!(back, buckets, "the wheel's buckets");
    let mut wheel_ids = HashSet::new();
    for (slot, _) in &buckets {
        let ids: Vec<String> = conn
            .lrange(format!("{}:{slot}", keys.wheel(0)), 0, -1)
            .await
            .expect("LRANGE");
        wheel_ids.extend(ids);
    }
    assert_eq!(
        wheel_ids,
        bucket_ids.into_iter().flatten().collect::<HashSet<_>>()
    );
    let again = hookq(&redis, PARTITIONS, &["--json", "migrate"]);
    assert!(again.status.success());
    let report: serde_json::Value = serde_json::from_slice(&again.stdout).expect("JSON report");
    assert_eq!(report["timers_moved"], 0, "{report}");

    let daemon = start_daemon(&config).await;
    let got = receiver
        .wait_for_count(soon.len(), Duration::from_secs(20))
        .await;
    for request in &got {
        assert!(
            request.received_ms() >= due,
            "delivered {} ms early",
            due - request.received_ms()
        );
    }
    let stats = store.stats().await.expect("stats");
    assert_eq!(stats.scheduled, 16, "the far jobs wait: {stats:?}");
    daemon.stop().await.expect("clean stop");
}

/// Layout 5's data is layout 6's but for the round leases, which its
/// daemons would not see: a daemon and the CLI refuse layout 5, naming
/// `hookq migrate`, which converts nothing and writes the version; the
/// job waiting then reads as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_5_migrates_by_its_version_alone() {
    let redis = RedisServer::start();
    let mut conn = redis.conn().await;
    enqueue_in_an_hour(&redis, "l5-waits");
    let () = conn
        .set(format!("{NS}:schema"), "5")
        .await
        .expect("SET schema");
    assert_refused(&redis, "l5-waits", "layout 5").await;

    let report = migrate_report(&redis, 4);
    assert_eq!(report["schema"], "6", "{report}");
    assert_eq!(report["converted"], 0, "{report}");
    assert_eq!(schema(&mut conn).await.as_deref(), Some("6"));
    let out = hookq(&redis, 4, &["--json", "show", "l5-waits"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON view");
    assert_eq!(view["state"], "scheduled", "{view}");
}
