//! The reference receiver: nginx answering `return 204` on loopback ports
//! ([`Nginx`]), started from a temp dir of its own, and its access log read
//! back as counts of 2xx answers with their first and last times
//! ([`NginxStats`]). Every delivery-rate scenario measures against it.

use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::support::free_port;
use crate::support::process::OwnedProcess;
use crate::Res;

/// How many `server` blocks (ports) the bench's nginx listens on: the
/// healthy hosts of `many_hosts_one_hanging`; single-host scenarios use the
/// first.
pub const NGINX_SERVERS: usize = 20;

/// How often nginx writes its buffered access log (`flush=` of `access_log`).
/// Only the bench's notice of a finished run waits for it: each line carries
/// the time of its own request.
const NGINX_LOG_FLUSH_MS: u64 = 100;

/// nginx `return 204`, the reference receiver (SPEC §10, §11.6): the cheapest
/// answer per request, so the figures measure hookq and Redis, not the sink.
///
/// It runs as a direct child (`daemon off`) in its own process group
/// ([`OwnedProcess`], SIGKILLed with its group on drop), from a temp dir that
/// holds its `nginx.conf`, pid file, error log, access log and temp paths
/// (`-p`, `-c`, `-e`), so it needs no root and never reads `/etc/nginx`.
/// `master_process off` with one worker: a single process, which does the same
/// work as one worker under a master and has nothing else to reap; one worker
/// is plenty (wrk drives it at ~110k POST/s on the 2-core machine) and leaves
/// the cores to hookq and Redis. `keepalive_requests` is raised so that a
/// client's connections are reused for the whole run (nginx's default closes
/// one every 1,000 requests); `worker_connections 4096` covers 512
/// connections per host and more.
///
/// Counting: every server shares one access log with `log_format t '$msec
/// $status $server_port $request_uri'` (the request's end, wall clock with
/// ms, its status, the server's port and the URI),
/// buffered (`buffer=256k flush=100ms`, so nginx pays one write per few
/// thousand requests). The bench tails the file from its last offset, counts
/// the 2xx lines and keeps the smallest and largest `$msec`: a count is exact
/// (one line per request) and `$msec` is nginx's cached clock, updated every
/// event-loop turn, so it is at most one turn behind the answer. A URI
/// ending in `?due=<ms>` (the steady scenarios put each job's due time
/// there) adds the answer's lateness, `$msec` − due, to [`Nginx::lateness`].
pub struct Nginx {
    /// Declared first: dropped (killed) before its directory is removed.
    process: OwnedProcess,
    dir: tempfile::TempDir,
    ports: Vec<u16>,
    log: Mutex<AccessLog>,
}

/// The part of nginx's access log read so far.
#[derive(Default)]
struct AccessLog {
    /// Bytes of the file already read.
    offset: u64,
    /// An incomplete last line, kept until its newline arrives.
    pending: Vec<u8>,
    stats: NginxStats,
    /// 2xx answers per whole second of `$msec` (for rate-limit checks).
    per_second: std::collections::BTreeMap<i64, u64>,
    /// 2xx answers per server port (for shares between hosts).
    per_port: std::collections::HashMap<u16, u64>,
    /// `$msec` − due (ms) of each 2xx answer to a URI ending in `?due=<ms>`.
    lateness: Vec<i64>,
}

/// 2xx answers counted since the last [`Nginx::reset`], with the first and
/// last of their `$msec` times (wall clock, ms).
#[derive(Clone, Copy, Default)]
pub struct NginxStats {
    /// 2xx answers.
    pub count: u64,
    /// The first one's `$msec` (0 before any).
    pub first_ms: i64,
    /// The last one's `$msec`.
    pub last_ms: i64,
}

/// The nginx binary: on PATH, or Debian's `/usr/sbin/nginx` (not on a
/// non-root user's PATH).
fn nginx_binary() -> Res<std::path::PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([std::path::PathBuf::from("/usr/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "nginx is missing: scripts/test.sh installs it (or apt-get install nginx)".into()
        })
}

/// `123.456` (seconds with ms, nginx's `$msec`) in ms.
fn parse_msec(text: &str) -> Option<i64> {
    let (secs, frac) = text.split_once('.')?;
    Some(secs.parse::<i64>().ok()? * 1000 + frac.parse::<i64>().ok()?)
}

/// nginx's `nginx.conf` for a run from `dir` (pid file, logs and temp
/// paths there), one `server` block per port of `ports`.
fn nginx_conf(dir: &std::path::Path, ports: &[u16]) -> String {
    let d = dir.display();
    let listen: String = ports
        .iter()
        .map(|p| {
            // `/v1/traces` stands in for an OTLP collector; its
            // requests are not counted as deliveries.
            format!(
                "  server {{ listen 127.0.0.1:{p}; location / {{ return 204; }} \
                 location /v1/traces {{ access_log off; return 200; }} }}\n"
            )
        })
        .collect();
    format!(
        "daemon off;\n\
         master_process off;\n\
         worker_processes 1;\n\
         pid \"{d}/nginx.pid\";\n\
         error_log \"{d}/error.log\" warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         \x20 log_format t '$msec $status $server_port $request_uri';\n\
         \x20 access_log \"{d}/access.log\" t buffer=256k flush={NGINX_LOG_FLUSH_MS}ms;\n\
         \x20 keepalive_requests 1000000;\n\
         \x20 client_body_temp_path \"{d}/client_body\";\n\
         \x20 proxy_temp_path \"{d}/proxy\";\n\
         \x20 fastcgi_temp_path \"{d}/fastcgi\";\n\
         \x20 uwsgi_temp_path \"{d}/uwsgi\";\n\
         \x20 scgi_temp_path \"{d}/scgi\";\n\
         {listen}}}\n"
    )
}

/// Waits up to 10 s until nginx (`process`) answers 204 on every port of
/// `ports`; false if it did not or has exited.
async fn answers_on_every_port(
    client: &reqwest::Client,
    process: &mut OwnedProcess,
    ports: &[u16],
) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until && process.try_wait().is_none() {
        let mut answered = 0;
        for port in ports {
            let r = client
                .post(format!("http://127.0.0.1:{port}/ready"))
                .send()
                .await;
            if r.is_ok_and(|r| r.status() == 204) {
                answered += 1;
            }
        }
        if answered == ports.len() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

impl Nginx {
    /// Starts nginx with `servers` `server` blocks on free loopback ports and
    /// waits until each answers 204; tries fresh ports a few times (a port
    /// picked free may be taken before nginx binds it).
    pub async fn start(servers: usize) -> Res<Nginx> {
        let binary = nginx_binary()?;
        let client = reqwest::Client::new();
        let mut last_log = String::new();
        for _ in 0..5 {
            let dir = tempfile::tempdir()?;
            let mut ports: Vec<u16> = Vec::new();
            while ports.len() < servers {
                let port = free_port();
                if !ports.contains(&port) {
                    ports.push(port);
                }
            }
            let conf_path = dir.path().join("nginx.conf");
            std::fs::write(&conf_path, nginx_conf(dir.path(), &ports))?;
            let mut command = Command::new(&binary);
            command
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(&conf_path)
                .arg("-e")
                .arg(dir.path().join("error.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            let mut process = OwnedProcess::spawn(command, "nginx");
            let ready = answers_on_every_port(&client, &mut process, &ports).await;
            // Another listener on one of the ports would answer too, but not
            // with nginx still alive: a failed bind ends it.
            if ready && process.try_wait().is_none() {
                let nginx = Nginx {
                    process,
                    dir,
                    ports,
                    log: Mutex::new(AccessLog::default()),
                };
                nginx.reset().await?;
                return Ok(nginx);
            }
            last_log = format!(
                "{}{}",
                process.log(),
                std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default()
            );
        }
        Err(format!("nginx did not start in 5 tries; last log:\n{last_log}").into())
    }

    /// `http://127.0.0.1:<port of server i>{path}`.
    pub fn url(&self, server: usize, path: &str) -> String {
        format!(
            "http://127.0.0.1:{}{path}",
            self.ports[server % self.ports.len()]
        )
    }

    /// nginx's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Reads what nginx has appended to its access log since the last call.
    pub fn read_log(&self) -> Res<NginxStats> {
        use std::io::{Read, Seek, SeekFrom};
        let mut log = self.log.lock().map_err(|_| "access log lock poisoned")?;
        let mut file = std::fs::File::open(self.dir.path().join("access.log"))?;
        file.seek(SeekFrom::Start(log.offset))?;
        let mut new = Vec::new();
        file.read_to_end(&mut new)?;
        log.offset += new.len() as u64;
        log.pending.extend_from_slice(&new);
        let Some(end) = log.pending.iter().rposition(|b| *b == b'\n') else {
            return Ok(log.stats);
        };
        let lines: Vec<u8> = log.pending.drain(..=end).collect();
        for line in String::from_utf8_lossy(&lines).lines() {
            let mut fields = line.split(' ');
            let (Some(msec), Some(status)) = (fields.next(), fields.next()) else {
                continue;
            };
            let (Some(ms), true) = (parse_msec(msec), status.starts_with('2')) else {
                continue;
            };
            *log.per_second.entry(ms.div_euclid(1000)).or_insert(0) += 1;
            if let Some(port) = fields.next().and_then(|p| p.parse().ok()) {
                *log.per_port.entry(port).or_insert(0) += 1;
            }
            let due = fields
                .next()
                .and_then(|uri| uri.rsplit_once("?due=")?.1.parse::<i64>().ok());
            if let Some(due) = due {
                log.lateness.push(ms - due);
            }
            let s = &mut log.stats;
            s.count += 1;
            s.first_ms = if s.first_ms == 0 {
                ms
            } else {
                s.first_ms.min(ms)
            };
            s.last_ms = s.last_ms.max(ms);
        }
        Ok(log.stats)
    }

    /// Starts counting from zero: waits past one log flush, so that the lines
    /// of earlier requests are written, and skips them.
    pub async fn reset(&self) -> Res<()> {
        tokio::time::sleep(Duration::from_millis(NGINX_LOG_FLUSH_MS * 2 + 50)).await;
        self.read_log()?;
        let mut log = self.log.lock().map_err(|_| "access log lock poisoned")?;
        log.stats = NginxStats::default();
        log.per_second.clear();
        log.per_port.clear();
        log.lateness.clear();
        Ok(())
    }

    /// 2xx answers per whole second since the last reset, without the first
    /// and last seconds (partly used): the steady per-second counts.
    pub fn full_seconds(&self) -> Res<Vec<u64>> {
        let log = self.log.lock().map_err(|_| "access log lock poisoned")?;
        let counts: Vec<u64> = log.per_second.values().copied().collect();
        Ok(counts
            .get(1..counts.len().saturating_sub(1))
            .unwrap_or_default()
            .to_vec())
    }

    /// The lateness (ms, ascending) of every 2xx answer since the last reset
    /// whose URI carried its due time (`?due=<ms>`).
    pub fn lateness(&self) -> Res<Vec<i64>> {
        self.read_log()?;
        let log = self.log.lock().map_err(|_| "access log lock poisoned")?;
        let mut late = log.lateness.clone();
        late.sort_unstable();
        Ok(late)
    }

    /// 2xx answers of server `server` counted since the last reset.
    pub fn count_on(&self, server: usize) -> Res<u64> {
        self.read_log()?;
        let port = self.ports[server % self.ports.len()];
        let log = self.log.lock().map_err(|_| "access log lock poisoned")?;
        Ok(log.per_port.get(&port).copied().unwrap_or(0))
    }

    /// Waits until `n` 2xx answers have been counted since the last reset.
    pub async fn wait_for(&self, n: u64, deadline: Duration) -> Res<NginxStats> {
        let until = Instant::now() + deadline;
        loop {
            let stats = self.read_log()?;
            if stats.count >= n {
                return Ok(stats);
            }
            if Instant::now() > until {
                return Err(
                    format!("nginx answered {} of {n} within {deadline:?}", stats.count).into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
