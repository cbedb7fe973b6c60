//! The hookq Lua libraries on a Redis: which one a connection uses, and
//! deleting those no connected daemon uses.
//!
//! Each version and config of hookq loads a library of its own name
//! (`hookq_<digest>`, see [`Library`](super::scripts)), and Redis keeps a
//! library until it is deleted: without this, every upgrade or change of
//! `redis.wheel_bucket` left one more (0.25–0.5 MB each) in the one Lua state
//! all of Redis's functions share, which every call of every function pays
//! for as it grows (twenty cost ~6 % of Redis's CPU a job at 200 jobs/s,
//! four nothing measurable: docs/performance.md). A store names its connection after the
//! library it loaded (`CLIENT SETNAME`), and a daemon, when it starts,
//! deletes every `hookq_<digest>` library that no connected client is
//! named after: those of versions and configs no daemon runs any more. A
//! client of a deleted library that is still running (one of a version
//! from before the names, or one whose connection lost its name when it
//! reconnected) loads it again at its next call, as after a `FUNCTION
//! FLUSH`. A daemon deletes at its start only, never when it reloads its
//! own library, so daemons of two versions never delete each other's in
//! turn. On a Redis Cluster libraries are left alone (a library lives on
//! every master, a connection's name on the nodes it reached).

use std::collections::HashSet;

use redis::Value;

use super::connection::RedisConn;
use super::scripts::{Runner, LIBRARY_DIGEST_HEX, LIBRARY_PREFIX};
use super::{Store, StoreResult};

/// Whether `name` is a hookq library's, as [`Library`](super::scripts)
/// names them: [`LIBRARY_PREFIX`] and [`LIBRARY_DIGEST_HEX`] lowercase hex
/// digits.
fn is_hookq_library(name: &str) -> bool {
    name.strip_prefix(LIBRARY_PREFIX).is_some_and(|digest| {
        digest.len() == LIBRARY_DIGEST_HEX
            && digest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The clients' names in a `CLIENT LIST` reply (one client a line, its
/// fields `key=value` separated by spaces; a name has no space).
fn client_names(list: &str) -> HashSet<&str> {
    list.lines()
        .flat_map(|line| line.split(' '))
        .filter_map(|field| field.strip_prefix("name="))
        .filter(|name| !name.is_empty())
        .collect()
}

/// The libraries' names in a `FUNCTION LIST` reply (each library a map,
/// or in RESP2 a flat array of field, value).
fn library_names(list: &Value) -> Vec<String> {
    let Value::Array(libraries) = list else {
        return Vec::new();
    };
    libraries
        .iter()
        .filter_map(|library| {
            let fields: Vec<(String, Value)> = redis::from_redis_value(library).ok()?;
            let (_, name) = fields.into_iter().find(|(k, _)| k == "library_name")?;
            redis::from_redis_value(&name).ok()
        })
        .collect()
}

impl Store {
    /// Names the connection `conn` (on a single Redis) after this store's
    /// Lua library, so that a daemon starting on the same Redis keeps the
    /// library while this store is connected. Best effort: a refused name
    /// only leaves the library to be loaded again if it is deleted.
    pub(super) async fn name_connection(&self, conn: &mut RedisConn) {
        let RedisConn::Single(single) = conn else {
            return;
        };
        let named = redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(&self.scripts.library().name)
            .query_async::<()>(single)
            .await;
        if let Err(err) = named {
            tracing::debug!(cause = %err, "cannot name the Redis connection after the Lua library");
        }
    }

    /// The hookq libraries on the Redis besides this store's own: those a
    /// connected client is named after, and the stale ones (none is; see
    /// the module doc). `None` on a Redis Cluster or without Functions.
    pub async fn other_libraries(&self) -> StoreResult<Option<OtherLibraries>> {
        let mut conn = self.conn.clone();
        let RedisConn::Single(single) = &mut conn else {
            return Ok(None);
        };
        if self.scripts.runner() != Runner::Functions {
            return Ok(None);
        }
        let listed: Value = redis::cmd("FUNCTION")
            .arg("LIST")
            .arg("LIBRARYNAME")
            .arg(format!("{LIBRARY_PREFIX}*"))
            .query_async(single)
            .await?;
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("TYPE")
            .arg("normal")
            .query_async(single)
            .await?;
        let named = client_names(&clients);
        let own = &self.scripts.library().name;
        let (in_use, stale) = library_names(&listed)
            .into_iter()
            .filter(|name| is_hookq_library(name) && name != own)
            .partition(|name| named.contains(name.as_str()));
        Ok(Some(OtherLibraries { in_use, stale }))
    }

    /// Deletes the stale hookq libraries on the Redis (see
    /// [`Store::other_libraries`]), keeping this store's own, those a
    /// connected client is named after and every library not hookq's;
    /// answers the names deleted. Nothing on a Redis Cluster or without
    /// Functions. An error (`CLIENT LIST` refused by the user's ACL, say)
    /// deletes nothing more.
    pub async fn delete_stale_libraries(&self) -> StoreResult<Vec<String>> {
        let Some(others) = self.other_libraries().await? else {
            return Ok(Vec::new());
        };
        let mut conn = self.conn.clone();
        let mut deleted = Vec::new();
        for name in others.stale {
            let gone = redis::cmd("FUNCTION")
                .arg("DELETE")
                .arg(&name)
                .query_async::<()>(&mut conn)
                .await;
            match gone {
                Ok(()) => deleted.push(name),
                // (Deleted meanwhile by another daemon starting.)
                Err(err) if err.to_string().contains("not found") => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(deleted)
    }
}

/// The hookq libraries on a Redis other than a store's own
/// ([`Store::other_libraries`]).
#[derive(Debug)]
pub struct OtherLibraries {
    /// Those a connected client is named after (daemons of other versions
    /// or configs still running).
    pub in_use: Vec<String>,
    /// Those no connected client is named after: the next daemon to start
    /// deletes them.
    pub stale: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_of_hookq_libraries_count() {
        assert!(is_hookq_library("hookq_e7b2484659d398bc"));
        assert!(!is_hookq_library("hookq_e7b2484659d398b"), "15 digits");
        assert!(!is_hookq_library("hookq_E7B2484659D398BC"), "upper case");
        assert!(!is_hookq_library("hookq_e7b2484659d398bcd"), "17 digits");
        assert!(!is_hookq_library("hookq_reports_v2abcdef"), "not hex");
        assert!(!is_hookq_library("mylib"));
    }

    #[test]
    fn client_names_are_read_from_each_line() {
        let list = "id=3 addr=127.0.0.1:5 laddr=127.0.0.1:6379 fd=8 name=hookq_e7b2484659d398bc age=1 db=0\n\
                    id=4 addr=127.0.0.1:6 laddr=127.0.0.1:6379 fd=9 name= age=2 db=0\n\
                    id=5 addr=127.0.0.1:7 laddr=127.0.0.1:6379 fd=10 name=worker age=2 lib-name=redis-rs\n";
        let names = client_names(list);
        assert_eq!(
            names,
            HashSet::from(["hookq_e7b2484659d398bc", "worker"]),
            "unnamed clients name nothing; lib-name is not a name"
        );
    }

    #[test]
    fn library_names_read_either_protocol() {
        let resp2 = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"library_name".to_vec()),
            Value::BulkString(b"hookq_0000000000000001".to_vec()),
            Value::BulkString(b"engine".to_vec()),
            Value::BulkString(b"LUA".to_vec()),
        ])]);
        let resp3 = Value::Array(vec![Value::Map(vec![
            (
                Value::BulkString(b"library_name".to_vec()),
                Value::BulkString(b"mylib".to_vec()),
            ),
            (
                Value::BulkString(b"engine".to_vec()),
                Value::BulkString(b"LUA".to_vec()),
            ),
        ])]);
        assert_eq!(library_names(&resp2), ["hookq_0000000000000001"]);
        assert_eq!(library_names(&resp3), ["mylib"]);
        assert!(library_names(&Value::Nil).is_empty());
    }
}
