//! The memory scenarios: Redis bytes per scheduled job (stock and tuned
//! `hash-max-listpack-value`, mixed bodies) and per finished job (a
//! summary, with bodies kept, with attempt histories).

use std::collections::HashMap;
use std::time::Duration;

use hookq::job::JobInput;

use crate::common::{config, job, loaded_store, preload};
use crate::support::redis::RedisServer;
use crate::support::store::complete_claimed;
use crate::{Figures, Res};

/// Redis's own default `hash-max-listpack-value`; the tuned value the
/// memory scenarios compare it with is hookq's recommendation,
/// [`RECOMMENDED_LISTPACK_VALUE`](hookq::doctor::RECOMMENDED_LISTPACK_VALUE)
/// (doctor's).
pub const STOCK_LISTPACK_VALUE: u64 = 64;

/// Empties the bench's Redis and sets its `hash-max-listpack-value` (the
/// memory scenarios compare stock and tuned; each leaves it stock again).
async fn empty_redis_with_listpack_value(redis: &RedisServer, value: u64) -> Res<()> {
    redis.flush().await?;
    redis
        .config_set("hash-max-listpack-value", &value.to_string())
        .await?;
    Ok(())
}

/// Redis memory per scheduled job, as a user's jobs look: a 26-character id
/// (a generated ULID is as long), URL `http://sink.example/hook` (24 bytes),
/// body `{"due":<13 digits>}` (22 bytes), due over the day after the next
/// hour. `beyond_body_url` is what SPEC §11.2 bounds. Redis's
/// `hash-max-listpack-value` is set to `listpack_value` (hookq's records are
/// strings since layout 2, so it should not matter; shown for comparison).
pub async fn memory(
    redis: &RedisServer,
    n: usize,
    listpack_value: u64,
    mixed_bodies: bool,
) -> Res<Figures> {
    empty_redis_with_listpack_value(redis, listpack_value).await?;
    let cfg = config(redis);
    let store = loaded_store(&cfg).await?;
    let before = redis.used_memory().await?;
    let first_due = store.redis_time_ms().await? + 3_600_000;
    let spacing = 86_400_000 / n as i64;
    let url = "http://sink.example/hook";
    let mut body_bytes = 0usize;
    let jobs: Vec<JobInput> = (0..n)
        .map(|i| {
            let due = first_due + i as i64 * spacing;
            let mut input = job(format!("mem-{i:022}"), url.into(), due);
            if mixed_bodies {
                // Bodies of 30 to 285 bytes, evenly spread, so that the
                // allocator's size classes average out.
                let pad = "x".repeat(i % 256);
                input.body = serde_json::value::RawValue::from_string(format!(
                    r#"{{"due":{due},"pad":"{pad}"}}"#
                ))
                .ok();
            }
            body_bytes += input.body.as_ref().map_or(0, |b| b.get().len()) + url.len();
            input
        })
        .collect();
    preload(&store, &cfg, jobs).await?;
    let after = redis.used_memory().await?;
    // Back to the bench's stock Redis for the scenarios that follow.
    empty_redis_with_listpack_value(redis, STOCK_LISTPACK_VALUE).await?;
    let per_job = (after - before) as f64 / n as f64;
    Ok(HashMap::from([
        ("bytes_per_job", per_job),
        ("beyond_body_url", per_job - body_bytes as f64 / n as f64),
    ]))
}

/// Redis memory per retained finished job: `n` jobs (26-character ids,
/// topic `orders.paid`) created due now, claimed and recorded as delivered
/// (a 204 in 12 ms) as the daemon records them, in batches of 256. What
/// remains is one summary per job (SPEC §11.2 bounds it at 100 bytes), or
/// with `keep_bodies` the whole record and its one-entry history.
pub async fn memory_finished(
    redis: &RedisServer,
    n: usize,
    listpack_value: u64,
    keep_bodies: bool,
) -> Res<Figures> {
    empty_redis_with_listpack_value(redis, listpack_value).await?;
    let mut cfg = config(redis);
    cfg.retention.keep_bodies = keep_bodies;
    let store = loaded_store(&cfg).await?;
    let before = redis.used_memory().await?;
    let now = store.redis_time_ms().await?;
    let jobs = (0..n)
        .map(|i| JobInput {
            topic: Some("orders.paid".into()),
            ..job(
                format!("fin-{i:022}"),
                "http://sink.example/hook".into(),
                now,
            )
        })
        .collect();
    preload(&store, &cfg, jobs).await?;
    let mut recorded = 0;
    for p in 0..cfg.redis.partitions {
        loop {
            let claimed = store.claim(p, 256).await?.jobs;
            if claimed.is_empty() {
                break;
            }
            let done = complete_claimed(&store, p, &claimed, |c| {
                format!(
                    r#"{{"attempt":1,"at":{},"duration_ms":12,"status":204}}"#,
                    c.claimed_at
                )
            })
            .await?;
            recorded += done.len();
        }
    }
    let after = redis.used_memory().await?;
    empty_redis_with_listpack_value(redis, STOCK_LISTPACK_VALUE).await?;
    if recorded != n {
        return Err(format!("recorded {recorded} of {n} jobs").into());
    }
    Ok(HashMap::from([(
        "bytes_per_finished_job",
        (after - before) as f64 / n as f64,
    )]))
}

/// Summary memory with attempt histories (SPEC §11.2: at most 100 bytes a
/// summary delivered on its first attempt, at most 12 bytes more per
/// earlier attempt), on Redis's stock listpack limits (128 entries of 64
/// bytes, set explicitly): `n` jobs as [`memory_finished`] makes them, all
/// delivered on their first attempt, then (after a flush) `n` jobs of which
/// every tenth fails once (a 503 in 31 ms, recorded as the daemon records
/// it) before its delivery. Reports `bytes_per_summary_first_attempt`,
/// `bytes_per_summary_mix` and `bytes_per_earlier_attempt` (what the mix
/// costs beyond the first run, over its earlier attempts) from the summary
/// keys' `MEMORY USAGE` (exact: `used_memory` moves by a few bytes a job
/// from run to run, tens of bytes an earlier attempt at one in ten), and
/// `used_memory` per job beside them.
pub async fn memory_finished_retried(redis: &RedisServer, n: usize) -> Res<Figures> {
    let mut conn = redis.conn().await;
    let (_, entries_before): (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("hash-max-listpack-entries")
        .query_async(&mut conn)
        .await?;
    let mut per_summary = Vec::new();
    for every in [0usize, 10] {
        empty_redis_with_listpack_value(redis, STOCK_LISTPACK_VALUE).await?;
        redis.config_set("hash-max-listpack-entries", "128").await?;
        let cfg = config(redis);
        let store = loaded_store(&cfg).await?;
        let before = redis.used_memory().await?;
        let now = store.redis_time_ms().await?;
        let jobs = (0..n)
            .map(|i| JobInput {
                topic: Some("orders.paid".into()),
                ..job(
                    format!("fin-{i:022}"),
                    "http://sink.example/hook".into(),
                    now,
                )
            })
            .collect();
        preload(&store, &cfg, jobs).await?;
        let retried =
            |id: &str| every > 0 && id[4..].parse::<usize>().is_ok_and(|i| i % every == 0);
        let mut recorded = 0;
        for p in 0..cfg.redis.partitions {
            let mut failed = 0;
            loop {
                let claimed = store.claim(p, 256).await?.jobs;
                if claimed.is_empty() {
                    if failed == 0 {
                        break;
                    }
                    // The failed jobs are due again now: promote them.
                    store.promote(p, 100_000).await?;
                    failed = 0;
                    continue;
                }
                let (first, rest): (Vec<_>, Vec<_>) = claimed
                    .into_iter()
                    .partition(|c| c.attempt == 1 && retried(&c.id));
                for c in &first {
                    let record = format!(
                        r#"{{"attempt":1,"at":{},"duration_ms":31,"status":503,"error":"http_status","message":"receiver answered 503"}}"#,
                        c.claimed_at
                    );
                    let failure = hookq::store::Failure {
                        record: &record,
                        last_error: "http_status: receiver answered 503",
                        last_status: Some(503),
                        topic: "orders.paid",
                        action: hookq::retry::FailAction::Retry(Duration::ZERO),
                    };
                    store.fail(c, &failure).await?;
                }
                failed += first.len();
                let done = complete_claimed(&store, p, &rest, |c| {
                    format!(
                        r#"{{"attempt":{},"at":{},"duration_ms":12,"status":204}}"#,
                        c.attempt, c.claimed_at
                    )
                })
                .await?;
                recorded += done.iter().filter(|d| **d).count();
            }
        }
        let after = redis.used_memory().await?;
        let shards = summary_shard_bytes(redis).await?;
        redis
            .config_set("hash-max-listpack-entries", &entries_before)
            .await?;
        empty_redis_with_listpack_value(redis, STOCK_LISTPACK_VALUE).await?;
        if recorded != n {
            return Err(format!("recorded {recorded} of {n} jobs").into());
        }
        per_summary.push((shards as f64 / n as f64, (after - before) as f64 / n as f64));
    }
    let earlier = n.div_ceil(10) as f64;
    let (first, mix) = (per_summary[0], per_summary[1]);
    Ok(HashMap::from([
        ("bytes_per_summary_first_attempt", first.0),
        ("bytes_per_summary_mix", mix.0),
        (
            "bytes_per_earlier_attempt",
            (mix.0 - first.0) * n as f64 / earlier,
        ),
        ("used_memory_per_job_first_attempt", first.1),
        ("used_memory_per_job_mix", mix.1),
    ]))
}

/// Bytes of every summary shard and bucket index (`MEMORY USAGE` with
/// every element counted), after checking each shard is still a listpack.
async fn summary_shard_bytes(redis: &RedisServer) -> Res<i64> {
    let mut conn = redis.conn().await;
    let mut total = 0;
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("*:done*")
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        for key in keys {
            total += redis.listpack_bytes(&key).await?;
        }
        if next == 0 {
            return Ok(total);
        }
        cursor = next;
    }
}
