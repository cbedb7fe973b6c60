//! The fleet: the daemons sharing one Redis, each a member of the `fleet`
//! zset (scored by when its membership lapses) for as long as it beats.

use std::time::Duration;

use super::{arg, scripts, Store, StoreResult};

impl Store {
    /// Beats for daemon `id` in the fleet, its membership lasting `ttl` (zero:
    /// leaves); answers the live members' ids, sorted.
    pub(crate) async fn fleet_beat(&self, id: &str, ttl: Duration) -> StoreResult<Vec<String>> {
        let mut members: Vec<String> = self
            .invoke(
                &scripts::FLEET_BEAT,
                &[&self.keys.fleet()],
                &[arg(&id), arg(&(ttl.as_millis() as u64))],
            )
            .await?;
        members.sort_unstable();
        Ok(members)
    }

    /// The live members of the fleet (read only; ids sorted).
    pub(crate) async fn fleet_members(&self) -> StoreResult<Vec<String>> {
        let now = self.redis_time_ms().await?;
        let mut conn = self.conn.clone();
        let mut members: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.keys.fleet())
            .arg(format!("({now}"))
            .arg("+inf")
            .arg("BYSCORE")
            .query_async(&mut conn)
            .await?;
        members.sort_unstable();
        Ok(members)
    }
}
