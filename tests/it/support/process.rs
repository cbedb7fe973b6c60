//! A child process owned by one test, down to its grandchildren: it runs in a
//! process group of its own, its stderr goes to a log file in a temp dir, and
//! dropping the guard SIGKILLs the whole group and reaps the child. A test
//! that panics therefore leaves nothing running, and the log of a daemon is
//! printed only when the test fails (a passing test's output stays clean).

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How many bytes of a failing test's process log are printed.
const LOG_TAIL: usize = 8 * 1024;

/// A running child process in its own process group, killed with its group
/// on drop.
pub struct OwnedProcess {
    child: Child,
    name: String,
    log_dir: tempfile::TempDir,
    exited: Option<ExitStatus>,
    leftovers: Vec<PathBuf>,
}

impl OwnedProcess {
    /// Spawns `command` in a new process group, its stderr into a log file
    /// (stdin and stdout are left as the command sets them); panics naming
    /// `name` if it cannot start.
    pub fn spawn(mut command: Command, name: &str) -> OwnedProcess {
        let log_dir = tempfile::tempdir().expect("create a temp dir for a process log");
        let log = File::create(log_dir.path().join("stderr.log")).expect("create a process log");
        command.stderr(Stdio::from(log)).process_group(0);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("{name} does not start: {e}"));
        OwnedProcess {
            child,
            name: name.to_string(),
            log_dir,
            exited: None,
            leftovers: Vec::new(),
        }
    }

    /// Files the child creates outside the test's temp dirs and never
    /// removes (libfaketime's `/dev/shm` segments): removed once the group
    /// is dead.
    pub fn removes_on_drop(&mut self, paths: impl IntoIterator<Item = PathBuf>) {
        self.leftovers.extend(paths);
    }

    /// The child's process id (also its process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The file that receives the child's stderr.
    pub fn log_path(&self) -> PathBuf {
        self.log_dir.path().join("stderr.log")
    }

    /// The child's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Sends `sig` (`TERM`, `KILL`, ...) to the child itself; panics if
    /// `kill` fails (the child is gone).
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill runs");
        assert!(
            status.success(),
            "kill -{sig} {} ({})",
            self.pid(),
            self.name
        );
    }

    /// Whether the child has exited (its status is then kept).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().expect("try_wait on a child");
        }
        self.exited
    }

    /// Waits for the child to exit; panics once `deadline` has passed.
    pub async fn wait_exit(&mut self, deadline: Duration) -> ExitStatus {
        let until = Instant::now() + deadline;
        loop {
            if let Some(status) = self.try_wait() {
                return status;
            }
            assert!(
                Instant::now() < until,
                "{} did not exit within {deadline:?}; log:\n{}",
                self.name,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `kill -9` of the child itself (not its group: a daemon killed
    /// mid-run), then reaps it.
    pub async fn kill_9(&mut self) {
        self.signal("KILL");
        let _ = self.wait_exit(Duration::from_secs(5)).await;
    }

    /// SIGKILLs the whole process group and reaps the child.
    pub fn kill_group(&mut self) {
        super::kill_process_group(self.pid());
        if self.exited.is_none() {
            let _ = self.child.kill();
            self.exited = self.child.wait().ok();
        }
    }
}

impl Drop for OwnedProcess {
    fn drop(&mut self) {
        self.kill_group();
        for path in &self.leftovers {
            let _ = std::fs::remove_file(path);
        }
        if std::thread::panicking() {
            let log = self.log();
            let start = log.len().saturating_sub(LOG_TAIL);
            let start = (start..log.len())
                .find(|&i| log.is_char_boundary(i))
                .unwrap_or(log.len());
            let tail = &log[start..];
            eprintln!(
                "---- log of {} (pid {}) ----\n{tail}",
                self.name,
                self.pid()
            );
        }
    }
}
