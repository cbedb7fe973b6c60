//! Host state in Redis: the breaker records every daemon shares, the parking
//! of jobs held for a blocked host, and their reads for `GET /v1/hosts`.
//! Every change is one script of `lua/` (`host_*`, `park_jobs`, `unpark_jobs`).

use std::time::Duration;

use redis::AsyncCommands;
use serde::Serialize;

use super::scripts::Code;
use super::{arg, scripts, Claimed, Store, StoreResult};

/// A host's breaker state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostState {
    /// Attempts go out.
    Closed,
    /// Too many consecutive failures: jobs wait until a probe.
    Open,
    /// One probe attempt is allowed.
    HalfOpen,
    /// Held by an operator or a receiver's `Retry-After`.
    Paused,
}

impl HostState {
    /// Parses a record's `state` (absent or unknown: closed).
    pub(crate) fn parse(text: Option<&str>) -> HostState {
        text.and_then(HostState::named).unwrap_or(HostState::Closed)
    }

    /// The state called `name` (`closed`, `open`, `half_open`, `paused`),
    /// as a filter names it; None for anything else.
    pub(crate) fn named(name: &str) -> Option<HostState> {
        match name {
            "closed" => Some(HostState::Closed),
            "open" => Some(HostState::Open),
            "half_open" => Some(HostState::HalfOpen),
            "paused" => Some(HostState::Paused),
            _ => None,
        }
    }

    /// The snake_case name.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            HostState::Closed => "closed",
            HostState::Open => "open",
            HostState::HalfOpen => "half_open",
            HostState::Paused => "paused",
        }
    }
}

/// A host's shared record.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRecord {
    /// `scheme://host:port`.
    pub host: String,
    /// Breaker state.
    pub state: HostState,
    /// Consecutive failed attempts.
    pub consecutive_failures: u64,
    /// When it opened or was paused (epoch ms), if it is not closed.
    pub opened_at: Option<i64>,
    /// Next probe (open, half-open) or end of a pause (epoch ms), if any.
    pub next_probe_at: Option<i64>,
    /// Last failure, or why it is paused.
    pub reason: Option<String>,
}

/// What the breaker decided about a failed attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureCount {
    /// The host's state after it.
    pub state: HostState,
    /// Its consecutive failures.
    pub failures: u64,
    /// Whether it opened now.
    pub opened: bool,
}

fn positive(value: Option<String>) -> Option<i64> {
    value.and_then(|v| v.parse().ok()).filter(|&v: &i64| v > 0)
}

impl Store {
    /// Runs a `host_*` script: its KEYS are the first `def.keys` of (host
    /// record, blocked set, known set), all in the `{hosts}` slot.
    async fn invoke_host<T: redis::FromRedisValue>(
        &self,
        def: &'static super::scripts::ScriptDef,
        host: &str,
        args: &[Vec<u8>],
    ) -> StoreResult<T> {
        let keys = [
            self.keys.host(host),
            self.keys.hosts_blocked(),
            self.keys.hosts_known(),
        ];
        let keys: Vec<&str> = keys.iter().take(def.keys).map(String::as_str).collect();
        self.invoke(def, &keys, args).await
    }

    /// Counts a failed attempt against `host`; `threshold` consecutive
    /// failures open it (0: count only).
    pub async fn host_failure(
        &self,
        host: &str,
        threshold: u32,
        open_for: Duration,
        max_open: Duration,
        reason: &str,
        probe: bool,
    ) -> StoreResult<FailureCount> {
        let (state, failures, opened): (String, u64, i64) = self
            .invoke_host(
                &scripts::HOST_FAILURE,
                host,
                &[
                    arg(&host),
                    arg(&threshold),
                    arg(&(open_for.as_millis() as u64)),
                    arg(&(max_open.as_millis() as u64)),
                    arg(&reason),
                    arg(&u8::from(probe)),
                    arg(&*self.channel),
                ],
            )
            .await?;
        Ok(FailureCount {
            state: HostState::parse(Some(&state)),
            failures,
            opened: opened == 1,
        })
    }

    /// Records that `host` answered; true when a probe closed it.
    pub async fn host_success(&self, host: &str, probe: bool) -> StoreResult<bool> {
        let (_state, closed): (String, i64) = self
            .invoke_host(
                &scripts::HOST_SUCCESS,
                host,
                &[arg(&host), arg(&u8::from(probe)), arg(&*self.channel)],
            )
            .await?;
        Ok(closed == 1)
    }

    /// `begin` (open → half-open when its probe time came) or `take` (the
    /// probe of a half-open host, for `lease`); whether granted.
    pub async fn host_probe(&self, host: &str, step: &str, lease: Duration) -> StoreResult<bool> {
        let code: Code = self
            .invoke_host(
                &scripts::HOST_PROBE,
                host,
                &[
                    arg(&host),
                    arg(&step),
                    arg(&(lease.as_millis() as u64)),
                    arg(&*self.channel),
                ],
            )
            .await?;
        Ok(code == Code::Done)
    }

    /// Pauses `host` until `until_ms` (0: until resumed); whether it changed.
    pub(crate) async fn host_pause(
        &self,
        host: &str,
        until_ms: i64,
        reason: &str,
    ) -> StoreResult<bool> {
        let code: Code = self
            .invoke_host(
                &scripts::HOST_PAUSE,
                host,
                &[
                    arg(&host),
                    arg(&until_ms.max(0)),
                    arg(&reason),
                    arg(&*self.channel),
                ],
            )
            .await?;
        Ok(code == Code::Done)
    }

    /// Closes a paused or open `host` (`operator`), or a paused one whose
    /// pause ran out (`expired`); whether it changed.
    pub async fn host_resume(&self, host: &str, why: &str) -> StoreResult<bool> {
        let code: Code = self
            .invoke_host(
                &scripts::HOST_RESUME,
                host,
                &[arg(&host), arg(&why), arg(&*self.channel)],
            )
            .await?;
        Ok(code == Code::Done)
    }

    /// A turn at draining `host` (`take`, for `lease`), its end (`done`), or
    /// a note that jobs were just parked for it (`note`); whether granted.
    pub(crate) async fn host_drain(
        &self,
        host: &str,
        step: &str,
        lease: Duration,
    ) -> StoreResult<bool> {
        let code: Code = self
            .invoke_host(
                &scripts::HOST_DRAIN,
                host,
                &[arg(&host), arg(&step), arg(&(lease.as_millis() as u64))],
            )
            .await?;
        Ok(code == Code::Done)
    }

    /// Parks claimed jobs of partition `p` for `host`; the number parked.
    pub async fn park(&self, p: u16, host: &str, jobs: &[&Claimed]) -> StoreResult<usize> {
        if jobs.is_empty() {
            return Ok(0);
        }
        let mut args = vec![arg(&self.keys.job_prefix(p)), arg(&host)];
        for job in jobs {
            args.push(arg(&job.id));
            args.push(arg(&job.attempt));
        }
        self.invoke(
            &scripts::PARK_JOBS,
            &[
                &self.keys.inflight(p),
                &self.keys.park(p, host),
                &self.keys.parked_hosts(p),
                &self.keys.seq(p),
            ],
            &args,
        )
        .await
    }

    /// Moves up to `n` of `host`'s parked jobs of partition `p` back to the
    /// due set: (moved, still parked there).
    pub async fn unpark(&self, p: u16, host: &str, n: usize) -> StoreResult<(usize, usize)> {
        self.invoke(
            &scripts::UNPARK_JOBS,
            &[
                &self.keys.park(p, host),
                &self.keys.parked_hosts(p),
                &self.keys.due(p),
                &self.keys.seq(p),
            ],
            &[
                arg(&self.keys.job_prefix(p)),
                arg(&host),
                arg(&n.max(1)),
                arg(&*self.channel),
                arg(&p),
            ],
        )
        .await
    }

    /// Per partition, how many jobs are parked for `host` (one pipelined
    /// round trip; partitions in a cluster are asked node by node).
    pub async fn parked_counts(&self, host: &str) -> StoreResult<Vec<(u16, u64)>> {
        // Concurrent commands on the multiplexed connection go out together.
        let counts = (0..self.keys.partitions()).map(|p| {
            let mut conn = self.conn.clone();
            let key = self.keys.park(p, host);
            async move {
                let n: u64 = conn.zcard(key).await?;
                Ok::<_, super::StoreError>((p, n))
            }
        });
        let mut out = Vec::new();
        for result in futures_util::future::join_all(counts).await {
            let (p, n) = result?;
            if n > 0 {
                out.push((p, n));
            }
        }
        Ok(out)
    }

    /// Hosts some daemon must act on, with when (epoch ms; `i64::MAX` for a
    /// pause without end), earliest first, at most `limit`.
    pub(crate) async fn blocked_hosts(&self, limit: usize) -> StoreResult<Vec<(String, i64)>> {
        let mut conn = self.conn.clone();
        let raw: Vec<(String, f64)> = conn
            .zrange_withscores(self.keys.hosts_blocked(), 0, limit as isize - 1)
            .await?;
        Ok(raw
            .into_iter()
            .map(|(h, s)| (h, if s.is_finite() { s as i64 } else { i64::MAX }))
            .collect())
    }

    /// Hosts with a breaker record (unordered).
    pub(crate) async fn known_hosts(&self) -> StoreResult<Vec<String>> {
        let mut conn = self.conn.clone();
        Ok(conn.zrange(self.keys.hosts_known(), 0, -1).await?)
    }

    /// The breaker record of `host` (a closed record when it has none).
    pub async fn host_record(&self, host: &str) -> StoreResult<HostRecord> {
        let mut conn = self.conn.clone();
        let [state, fails, opened_at, next, reason]: [Option<String>; 5] = redis::cmd("HMGET")
            .arg(self.keys.host(host))
            .arg(&["state", "fails", "opened_at", "next_probe_at", "reason"])
            .query_async(&mut conn)
            .await?;
        let state = HostState::parse(state.as_deref());
        let blocked = state != HostState::Closed;
        Ok(HostRecord {
            host: host.to_string(),
            state,
            consecutive_failures: fails.and_then(|f| f.parse().ok()).unwrap_or(0),
            opened_at: positive(opened_at).filter(|_| blocked),
            next_probe_at: positive(next).filter(|_| blocked),
            reason: reason.filter(|r| !r.is_empty()),
        })
    }
}
