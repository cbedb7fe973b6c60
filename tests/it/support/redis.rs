//! A real `redis-server` owned by one test: a free loopback port (never 6379),
//! its own temp dir as `--dir`, output logged to `redis.log` there, killed and
//! reaped when dropped. `restart` brings it back on the same port and dir, so
//! tests can check AOF recovery.

use std::fs::{File, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a start (or restart) may take before the test fails.
const READY_DEADLINE: Duration = Duration::from_secs(10);
/// How many fresh ports `start_with` tries before giving up.
const START_TRIES: usize = 5;

/// A running `redis-server` child process.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a server with persistence off (`--save "" --appendonly no`).
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra arguments, which come last and so override
    /// the defaults (e.g. `&["--appendonly", "yes"]`).
    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        let args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let mut last_log = String::new();
        for _ in 0..START_TRIES {
            let mut server = RedisServer {
                child: None,
                port: super::free_port(),
                dir: tempfile::tempdir().expect("create a temp dir for redis-server"),
                args: args.clone(),
            };
            if server.spawn() {
                return server;
            }
            last_log = server.log();
        }
        panic!(
            "redis-server did not start in {START_TRIES} tries (is it installed? scripts/test.sh \
             installs it); last log:\n{last_log}"
        );
    }

    /// Spawns the child on `self.port` and waits until it answers PING.
    /// Returns false if it exited or did not answer within the deadline.
    fn spawn(&mut self) -> bool {
        let log = self.open_log();
        let stderr = log
            .try_clone()
            .expect("clone the redis-server log file handle");
        let child = Command::new("redis-server")
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--daemonize")
            .arg("no")
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr))
            // Its own process group: a background save or AOF rewrite child
            // dies with it.
            .process_group(0)
            .spawn()
            .expect("spawn redis-server (is it on PATH? scripts/test.sh installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + READY_DEADLINE;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_status)) = child.try_wait() {
                    // Exited: most likely the port was taken in the meantime.
                    self.child = None;
                    return false;
                }
            }
            if self.ping() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        false
    }

    /// The log file, opened for appending (a restart adds to it).
    fn open_log(&self) -> File {
        let path = self.log_path();
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open redis-server log {}: {e}", path.display()))
    }

    /// True if the server answers PING (not while it is still loading data).
    fn ping(&self) -> bool {
        let Ok(client) = ::redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        matches!(
            ::redis::cmd("PING").query::<String>(&mut conn).as_deref(),
            Ok("PONG")
        )
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's data directory (`--dir`).
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// The file that receives the server's stdout and stderr.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// The server's log so far (empty if there is none yet).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A new multiplexed async connection; panics if the server is unreachable.
    pub async fn conn(&self) -> ::redis::aio::MultiplexedConnection {
        ::redis::Client::open(self.url())
            .expect("parse the test redis url")
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("connect to test redis at {}: {e}", self.url()))
    }

    /// `FLUSHALL`.
    pub async fn flush(&self) -> ::redis::RedisResult<()> {
        ::redis::cmd("FLUSHALL")
            .query_async(&mut self.try_conn().await?)
            .await
    }

    /// `CONFIG SET name value`.
    pub async fn config_set(&self, name: &str, value: &str) -> ::redis::RedisResult<()> {
        ::redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut self.try_conn().await?)
            .await
    }

    /// Bytes hash `key` takes (`MEMORY USAGE` with every element counted),
    /// once it is checked to be still a listpack (an error naming its
    /// encoding otherwise): what the summary memory figures sum.
    pub async fn listpack_bytes(&self, key: &str) -> Result<i64, String> {
        let mut conn = self.conn().await;
        let encoding: String = ::redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("OBJECT ENCODING {key}: {e}"))?;
        if encoding != "listpack" {
            return Err(format!("{key} is a {encoding}, not a listpack"));
        }
        let bytes: Option<i64> = ::redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("MEMORY USAGE {key}: {e}"))?;
        Ok(bytes.unwrap_or(0))
    }

    /// Bytes of memory Redis uses (`INFO memory` `used_memory`).
    pub async fn used_memory(&self) -> ::redis::RedisResult<i64> {
        self.info_field("memory", "used_memory").await
    }

    /// Sum of the due-set sequence counters of hookq's partitions (namespace
    /// `hookq`): it moves by one per job put in a due set (created for later,
    /// or given back for a later turn of its host).
    pub async fn due_sequence_total(&self, partitions: u16) -> ::redis::RedisResult<i64> {
        let mut conn = self.conn().await;
        let mut total = 0;
        for p in 0..partitions {
            let n: Option<i64> = ::redis::cmd("GET")
                .arg(format!("hookq:{{{p}}}:seq"))
                .query_async(&mut conn)
                .await?;
            total += n.unwrap_or(0);
        }
        Ok(total)
    }

    /// Script calls Redis has served (`FCALL`, `EVALSHA` and `EVAL`): hookq's
    /// requests are all scripts.
    pub async fn script_calls(&self) -> ::redis::RedisResult<i64> {
        self.calls_of(is_script_stat).await
    }

    /// The sum of `calls=` over the `INFO commandstats` lines `wanted` keeps.
    pub async fn calls_of(&self, wanted: impl Fn(&str) -> bool) -> ::redis::RedisResult<i64> {
        let info = self.info("commandstats").await?;
        Ok(command_stat_sum(&info, "calls", wanted))
    }

    /// One `INFO commandstats` read: the commands served, the script calls
    /// among them and the time spent inside those (see [`CommandStats`]).
    pub async fn command_stats(&self) -> ::redis::RedisResult<CommandStats> {
        let info = self.info("commandstats").await?;
        Ok(CommandStats {
            commands: command_stat_sum(&info, "calls", |l| {
                l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:")
            }),
            scripts: command_stat_sum(&info, "calls", is_script_stat),
            script_usec: command_stat_sum(&info, "usec", is_script_stat),
        })
    }

    /// CPU seconds Redis has used, user and system.
    pub async fn cpu_seconds(&self) -> ::redis::RedisResult<f64> {
        let (user, system) = self.cpu_user_system().await?;
        Ok(user + system)
    }

    /// CPU seconds Redis has used (`INFO cpu`), user and system apart: the
    /// system part is its system calls (the network, its wakes).
    pub async fn cpu_user_system(&self) -> ::redis::RedisResult<(f64, f64)> {
        let info = self.info("cpu").await?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Ok((field("used_cpu_user:"), field("used_cpu_sys:")))
    }

    /// How many times Redis's main thread has gone to sleep and been woken
    /// (its voluntary context switches, from /proc): a sleeping Redis
    /// wakes for each request that finds it idle. 0 where /proc does not
    /// tell, or the server is not running.
    pub fn wakes(&self) -> i64 {
        let Some(pid) = self.pid() else { return 0 };
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// One integer field of `INFO section`.
    pub async fn info_field(&self, section: &str, field: &str) -> ::redis::RedisResult<i64> {
        let info = self.info(section).await?;
        let prefix = format!("{field}:");
        info.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| {
                ::redis::RedisError::from((
                    ::redis::ErrorKind::TypeError,
                    "no such INFO field",
                    format!("{field} in INFO {section}"),
                ))
            })
    }

    async fn info(&self, section: &str) -> ::redis::RedisResult<String> {
        ::redis::cmd("INFO")
            .arg(section)
            .query_async(&mut self.try_conn().await?)
            .await
    }

    async fn try_conn(&self) -> ::redis::RedisResult<::redis::aio::MultiplexedConnection> {
        ::redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }

    /// SIGKILLs the server and its process group (a fork doing a background
    /// save or AOF rewrite) and reaps it: no shutdown save, no AOF rewrite.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            super::kill_process_group(child.id());
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts it again on the same port and directory,
    /// waiting until it answers PING (so an enabled AOF has been replayed).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + READY_DEADLINE;
        while Instant::now() < deadline {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "redis-server did not restart on port {}; log:\n{}",
            self.port,
            self.log()
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Counters of one `INFO commandstats` read ([`RedisServer::command_stats`]).
pub struct CommandStats {
    /// Commands served, scripts included, except `INFO` itself (which
    /// measuring sends).
    pub commands: i64,
    /// Script calls (`FCALL`, `EVALSHA`, `EVAL`): hookq's requests are all
    /// scripts.
    pub scripts: i64,
    /// Microseconds spent inside script calls: what the scripts cost, as
    /// against the event loop, the network and the kernel around them.
    pub script_usec: i64,
}

/// The sum of field `field` (`calls`, `usec`) over the lines of `INFO
/// commandstats` text `info` that `wanted` keeps.
fn command_stat_sum(info: &str, field: &str, wanted: impl Fn(&str) -> bool) -> i64 {
    let key = format!("{field}=");
    info.lines()
        .filter(|l| wanted(l))
        .filter_map(|l| {
            l.split(key.as_str())
                .nth(1)?
                .split(',')
                .next()?
                .parse::<i64>()
                .ok()
        })
        .sum()
}

/// Whether an `INFO commandstats` line is a script command's (`FCALL`,
/// `EVALSHA`, `EVAL`): hookq's requests are all scripts.
fn is_script_stat(line: &str) -> bool {
    ["cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_fcall:"]
        .iter()
        .any(|c| line.starts_with(c))
}
