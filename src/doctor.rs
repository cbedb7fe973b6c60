//! `hookq doctor`: checks the Redis hookq is configured for and says what to
//! fix — version, persistence, eviction policy, every partition reachable,
//! scripts loadable.

use std::collections::HashMap;

use serde::Serialize;

use crate::config::Config;
use crate::store::Store;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Works, but risks losing jobs or time; worth fixing.
    Warn,
    /// Must be fixed.
    Fail,
}

impl Status {
    /// Short label for tables.
    pub fn label(&self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// Outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// The exact fix, when not ok.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// All checks.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// In order.
    pub checks: Vec<Check>,
}

impl Report {
    /// No check failed (warnings allowed).
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }
}

/// `hash-max-listpack-value` hookq recommends: job records (the job's JSON
/// plus a few small fields) up to this size stay in Redis's compact listpack
/// encoding.
pub const RECOMMENDED_LISTPACK_VALUE: u64 = 1024;

fn check(name: &'static str, status: Status, detail: String, fix: Option<String>) -> Check {
    Check {
        name,
        status,
        detail,
        fix,
    }
}

/// Runs every check against the Redis of `config`.
pub async fn run(config: &Config) -> Report {
    let mut checks = Vec::new();
    let store = match Store::connect_unchecked(config).await {
        Ok(store) => store,
        Err(err) => {
            checks.push(check(
                "connection",
                Status::Fail,
                format!("cannot connect to {}: {err}", config.redis.url),
                Some(
                    "start Redis (scripts/run.sh does) or fix `redis.url` / HOOKQ_REDIS__URL"
                        .into(),
                ),
            ));
            return Report { checks };
        }
    };
    checks.push(check(
        "connection",
        Status::Ok,
        format!("connected to {}", config.redis.url),
        None,
    ));
    let mut conn = store.conn();

    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("unknown")
        .trim()
        .to_string();
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    checks.push(if major >= 7 {
        check("redis version", Status::Ok, version, None)
    } else {
        check(
            "redis version",
            Status::Fail,
            format!("{version}; hookq needs Redis 7.0 or newer"),
            Some("upgrade Redis to 7.0 or newer".into()),
        )
    });

    let get = |name: &'static str| {
        let mut conn = store.conn();
        async move {
            redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async::<HashMap<String, String>>(&mut conn)
                .await
                .ok()
                .and_then(|m| m.get(name).cloned())
        }
    };
    match get("maxmemory-policy").await.as_deref() {
        Some("noeviction") => checks.push(check("maxmemory-policy", Status::Ok, "noeviction".into(), None)),
        Some(policy) => checks.push(check(
            "maxmemory-policy",
            Status::Fail,
            format!("{policy}: Redis may evict job records silently when full"),
            Some("redis-cli CONFIG SET maxmemory-policy noeviction, and set `maxmemory-policy noeviction` in redis.conf".into()),
        )),
        None => checks.push(check(
            "maxmemory-policy",
            Status::Warn,
            "cannot read (CONFIG GET refused)".into(),
            Some("make sure redis.conf has `maxmemory-policy noeviction`".into()),
        )),
    }
    match get("appendonly").await.as_deref() {
        Some("yes") => checks.push(check("appendonly", Status::Ok, "yes".into(), None)),
        Some(other) => checks.push(check(
            "appendonly",
            Status::Warn,
            format!("{other}: acknowledged jobs are lost if Redis restarts"),
            Some(
                "redis-cli CONFIG SET appendonly yes, and set `appendonly yes` in redis.conf"
                    .into(),
            ),
        )),
        None => checks.push(check(
            "appendonly",
            Status::Warn,
            "cannot read".into(),
            None,
        )),
    }
    match get("appendfsync").await.as_deref() {
        Some("always") => checks.push(check(
            "appendfsync",
            Status::Ok,
            "always: no acknowledged job is lost on power loss".into(),
            None,
        )),
        Some("everysec") => checks.push(check(
            "appendfsync",
            Status::Ok,
            "everysec: up to ~1 s of acknowledged jobs can be lost on power loss".into(),
            None,
        )),
        Some(other) => checks.push(check(
            "appendfsync",
            Status::Warn,
            format!("{other}: the OS decides when jobs reach disk"),
            Some(
                "redis-cli CONFIG SET appendfsync everysec (or always for payment callbacks)"
                    .into(),
            ),
        )),
        None => checks.push(check(
            "appendfsync",
            Status::Warn,
            "cannot read".into(),
            None,
        )),
    }

    // Not a correctness matter: with Redis's default (64 bytes) every job
    // record is stored as a full hash table, about twice the memory.
    match get("hash-max-listpack-value")
        .await
        .and_then(|v| v.parse::<u64>().ok())
    {
        Some(v) if v >= RECOMMENDED_LISTPACK_VALUE => checks.push(check(
            "hash-max-listpack-value",
            Status::Ok,
            v.to_string(),
            None,
        )),
        Some(v) => checks.push(check(
            "hash-max-listpack-value",
            Status::Warn,
            format!("{v}: job records above {v} bytes take about twice the memory"),
            Some(format!(
                "redis-cli CONFIG SET hash-max-listpack-value {RECOMMENDED_LISTPACK_VALUE}, and set it in redis.conf"
            )),
        )),
        None => checks.push(check(
            "hash-max-listpack-value",
            Status::Warn,
            "cannot read".into(),
            None,
        )),
    }

    let mut unreachable = Vec::new();
    for p in 0..store.keys().partitions() {
        let mut conn = store.conn();
        let reached: redis::RedisResult<String> = redis::cmd("TYPE")
            .arg(store.keys().due(p))
            .query_async(&mut conn)
            .await;
        if reached.is_err() {
            unreachable.push(p);
        }
    }
    checks.push(if unreachable.is_empty() {
        check(
            "partitions",
            Status::Ok,
            format!("all {} reachable", store.keys().partitions()),
            None,
        )
    } else {
        check(
            "partitions",
            Status::Fail,
            format!("unreachable: {unreachable:?}"),
            Some(
                "check every cluster node is up and `redis.cluster_nodes` lists reachable seeds"
                    .into(),
            ),
        )
    });

    checks.push(match store.load_scripts().await {
        Ok(()) => check(
            "scripts",
            Status::Ok,
            format!("{} loaded", crate::store::scripts::ALL.len()),
            None,
        ),
        Err(err) => check(
            "scripts",
            Status::Fail,
            format!("cannot load: {err}"),
            Some("allow SCRIPT LOAD/EVALSHA for hookq's Redis user (ACL: +@scripting)".into()),
        ),
    });
    checks.push(match store.schema_version().await {
        Ok(Some(v)) if v == crate::store::schema::SCHEMA_VERSION => {
            check("schema", Status::Ok, format!("layout {v}"), None)
        }
        Ok(None) => check(
            "schema",
            Status::Ok,
            "no hookq data yet (the first daemon writes the layout version)".into(),
            None,
        ),
        Ok(Some(v)) => check(
            "schema",
            Status::Fail,
            format!(
                "layout `{v}`; this hookq reads layout {}",
                crate::store::schema::SCHEMA_VERSION
            ),
            Some("stop every hookq daemon and run `hookq migrate`".into()),
        ),
        Err(err) => check("schema", Status::Fail, format!("cannot read: {err}"), None),
    });
    Report { checks }
}
