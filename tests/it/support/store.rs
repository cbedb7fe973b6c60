//! Driving the store directly as the daemon's workers would, for tests and
//! benchmark scenarios that set up finished jobs without a receiver.

use hookq::store::{Claimed, Delivery, Store, StoreResult};

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
    let items: Vec<(&str, u32, &Delivery)> = claimed
        .iter()
        .zip(&deliveries)
        .map(|(c, d)| (c.id.as_str(), c.attempt, d))
        .collect();
    store.complete_many(p, &items, None).await
}
