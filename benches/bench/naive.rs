//! The naive design of the seed notes, the baseline some scenarios compare
//! hookq with: a 1-second polling loop over the ZSET moving jobs one round
//! trip at a time, and workers popping a list. [`Runner`] runs either it or
//! hookq against a receiver.

use std::time::Duration;

use hookq::config::Config;
use hookq::daemon::Daemon;
use hookq::job::now_ms;
use redis::aio::MultiplexedConnection;
use tokio_util::sync::CancellationToken;

use crate::support::redis::RedisServer;
use crate::Res;

/// hookq or the naive design, delivering to a receiver.
pub enum Runner {
    /// A hookq daemon.
    Hookq(Daemon),
    /// The naive design: its stop token and tasks.
    Naive(CancellationToken, Vec<tokio::task::JoinHandle<()>>),
}

impl Runner {
    /// Starts the naive design (`naive`) or a hookq daemon with `cfg`,
    /// delivering to `url`.
    pub async fn start(redis: &RedisServer, cfg: &Config, naive: bool, url: String) -> Res<Runner> {
        if naive {
            Ok(start(redis.url(), url).await?)
        } else {
            Ok(Runner::Hookq(Daemon::start(cfg.clone()).await?))
        }
    }

    /// Stops it: the daemon drains; the naive tasks get 2 s each.
    pub async fn stop(self) -> Res<()> {
        match self {
            Runner::Hookq(d) => d.stop().await?,
            Runner::Naive(token, tasks) => {
                token.cancel();
                for t in tasks {
                    let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
                }
            }
        }
        Ok(())
    }
}

/// Writes `jobs` (id, due ms) to the naive design's keys, pipelined.
pub async fn preload(redis: &RedisServer, jobs: Vec<(String, i64)>) -> Res<()> {
    let mut c = redis::Client::open(redis.url())?
        .get_multiplexed_async_connection()
        .await?;
    for chunk in jobs.chunks(1000) {
        let mut pipe = redis::pipe();
        for (id, due) in chunk {
            pipe.zadd("naive:due", id, *due).ignore();
            pipe.set(format!("naive:job:{id}"), format!("{{\"due\":{due}}}"))
                .ignore();
        }
        pipe.query_async::<()>(&mut c).await?;
    }
    Ok(())
}

/// Starts the polling loop and 64 workers delivering to `sink_url`.
async fn start(redis_url: String, sink_url: String) -> Res<Runner> {
    let token = CancellationToken::new();
    let client = redis::Client::open(redis_url)?;
    let mut tasks = Vec::new();
    let conn = client.get_multiplexed_async_connection().await?;
    tasks.push(tokio::spawn(poll_due(token.clone(), conn)));
    let http = reqwest::Client::new();
    for _ in 0..64 {
        let conn = client.get_multiplexed_async_connection().await?;
        tasks.push(tokio::spawn(work(
            token.clone(),
            http.clone(),
            sink_url.clone(),
            conn,
        )));
    }
    Ok(Runner::Naive(token, tasks))
}

/// The polling loop: every second until `token` is cancelled, moves the
/// due jobs from `naive:due` to `naive:ready`, one round trip at a time.
async fn poll_due(token: CancellationToken, mut conn: MultiplexedConnection) {
    while !token.is_cancelled() {
        let now = now_ms() as f64;
        let due: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg("naive:due")
            .arg(0)
            .arg(now)
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        for id in due {
            let removed: i64 = redis::cmd("ZREM")
                .arg("naive:due")
                .arg(&id)
                .query_async(&mut conn)
                .await
                .unwrap_or(0);
            if removed == 1 {
                let _: Result<i64, _> = redis::cmd("RPUSH")
                    .arg("naive:ready")
                    .arg(&id)
                    .query_async(&mut conn)
                    .await;
            }
        }
        tokio::select! {
            _ = token.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// A worker: until `token` is cancelled, pops a ready job (BLPOP, 0.5 s),
/// POSTs its body to `url` and deletes it.
async fn work(
    token: CancellationToken,
    http: reqwest::Client,
    url: String,
    mut conn: MultiplexedConnection,
) {
    while !token.is_cancelled() {
        let popped: Option<(String, String)> = redis::cmd("BLPOP")
            .arg("naive:ready")
            .arg(0.5)
            .query_async(&mut conn)
            .await
            .unwrap_or(None);
        let Some((_, id)) = popped else { continue };
        let body: Option<String> = redis::cmd("GET")
            .arg(format!("naive:job:{id}"))
            .query_async(&mut conn)
            .await
            .unwrap_or(None);
        if let Some(body) = body {
            let _ = http
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await;
            let _: Result<i64, _> = redis::cmd("DEL")
                .arg(format!("naive:job:{id}"))
                .query_async(&mut conn)
                .await;
        }
    }
}
