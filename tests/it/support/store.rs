//! Driving the store directly as the daemon's workers would, for tests and
//! benchmark scenarios that set up finished jobs without a receiver.

use hookq::store::{Bucket, Claimed, Delivery, Lease, Store, StoreResult};

/// Records `claimed` jobs of partition `p` as delivered in one
/// `Store::complete_many` call, each with the delivery record (JSON) that
/// `record` writes for it; returns `complete_many`'s answer per job.
pub async fn complete_claimed(
    store: &Store,
    p: u16,
    claimed: &[Claimed],
    record: impl Fn(&Claimed) -> String,
) -> StoreResult<Vec<bool>> {
    let deliveries: Vec<Delivery> = claimed
        .iter()
        .map(|c| store.delivery_from_json(&c.spec_json, &record(c)))
        .collect();
    let items: Vec<(&str, u32, &Lease, &Delivery)> = claimed
        .iter()
        .zip(&deliveries)
        .map(|(c, d)| (c.id.as_str(), c.attempt, &c.lease, d))
        .collect();
    store.complete_many(p, &items, None).await
}

/// Claims and records as delivered every job of partition 0 that can be
/// claimed now (each with a 200 in 2 ms); how many.
pub async fn finish_all_claimable(store: &Store) -> usize {
    let mut recorded = 0;
    loop {
        let claimed = store.claim(0, 256).await.expect("claim").jobs;
        if claimed.is_empty() {
            return recorded;
        }
        let done = complete_claimed(store, 0, &claimed, |_| {
            r#"{"at":1,"duration_ms":2,"status":200}"#.into()
        })
        .await
        .expect("complete");
        assert!(done.iter().all(|d| *d));
        recorded += done.len();
    }
}

/// The summary shards of partition 0's `buckets` that exist, by key, with
/// their PTTL (a shard is made by its first write: one nobody wrote to is
/// absent).
pub async fn made_summary_shards(
    conn: &mut redis::aio::MultiplexedConnection,
    store: &Store,
    buckets: &[Bucket],
) -> Vec<(String, i64)> {
    let keys = store.keys();
    let mut made = Vec::new();
    for bucket in buckets {
        for shard in 0..bucket.shards {
            let key = keys.done_shard(0, &bucket.start, shard);
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(conn)
                .await
                .expect("PTTL");
            if ttl != -2 {
                made.push((key, ttl));
            }
        }
    }
    made
}
