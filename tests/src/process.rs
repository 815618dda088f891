//! One nginx master process under a temporary prefix: the handle both the
//! test harness ([`crate::Nginx`]) and the benchmarks use. It writes the
//! configuration after a common prelude (the module loaded, logs and pid
//! under the prefix, in the foreground) and stops the process on drop.

use std::fs;
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use crate::artifacts;

/// The lines every test nginx.conf starts with.
pub fn prelude() -> String {
    let (_, module) = artifacts();
    format!(
        "load_module {};\nerror_log logs/error.log info;\npid logs/nginx.pid;\ndaemon off;\n",
        module.display()
    )
}

/// A fresh prefix holding `nginx.conf` (the prelude, then `conf`) and an
/// empty `logs/`.
pub fn prefix_with(conf: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("logs")).unwrap();
    fs::write(dir.path().join("nginx.conf"), format!("{}{conf}", prelude())).unwrap();
    dir
}

/// A running nginx master; SIGQUIT, then SIGKILL, when dropped.
pub struct NginxProcess {
    child: Child,
    dir: tempfile::TempDir,
}

impl NginxProcess {
    /// Starts nginx on `conf` (after the prelude) without waiting for it.
    pub fn spawn(conf: &str) -> NginxProcess {
        let dir = prefix_with(conf);
        let child = crate::nginx_command(dir.path()).spawn().unwrap();
        NginxProcess { child, dir }
    }

    /// Starts nginx on `conf` and waits until its workers have forked.
    pub fn start(conf: &str) -> NginxProcess {
        let p = NginxProcess::spawn(conf);
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.worker_pids().is_empty() {
            assert!(Instant::now() < deadline, "nginx did not start: {}", p.error_log());
            std::thread::sleep(Duration::from_millis(50));
        }
        p
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn prefix(&self) -> &Path {
        self.dir.path()
    }

    pub fn error_log(&self) -> String {
        fs::read_to_string(self.dir.path().join("logs/error.log")).unwrap_or_default()
    }

    /// Worker PIDs: the master's children.
    pub fn worker_pids(&self) -> Vec<u32> {
        let path = format!("/proc/{}/task/{}/children", self.child.id(), self.child.id());
        fs::read_to_string(path)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// Kills the master and every worker with SIGKILL, as a crash of the
    /// whole service would (a worker outlives a killed master and keeps
    /// its sockets, so each is killed by its pid), and waits until all are
    /// gone.
    pub fn kill_all(&mut self) {
        let workers = self.worker_pids();
        let _ = self.child.kill();
        for pid in &workers {
            // SAFETY: kill(2) on a worker of the master we started.
            unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
        }
        let _ = self.child.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while workers.iter().any(|p| running(*p)) {
            assert!(Instant::now() < deadline, "workers {workers:?} outlived SIGKILL");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts nginx again in the same prefix, on the same configuration
    /// (and so the same ports), without waiting for it. After
    /// [`NginxProcess::kill_all`].
    pub fn respawn(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            panic!("nginx {} is still running", self.child.id());
        }
        self.child = crate::nginx_command(self.dir.path()).spawn().unwrap();
    }

    /// The master's exit status, if it exits within `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

/// Whether something listens on TCP `port` on IPv4 (`/proc/net/tcp`).
/// Probing a port nobody listens on can take it: a connect from an
/// ephemeral port may pick the very port it connects to (a TCP
/// self-connect), and the nginx that comes back cannot bind it.
pub fn listening(port: u16) -> bool {
    let table = fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!(":{port:04X}");
    table.lines().skip(1).any(|l| {
        let fields: Vec<&str> = l.split_whitespace().collect();
        fields.len() > 3 && fields[1].ends_with(&local) && fields[3] == "0A"
    })
}

/// Waits up to `timeout` until no socket but a TIME_WAIT one holds any of
/// `ports` locally: a killed server's connections linger a moment (closing
/// with clients that are still sending), and Linux refuses to bind a
/// listener beside them even with SO_REUSEADDR. nginx would retry, 500 ms
/// at a time.
pub fn wait_released(ports: &[u16], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let locals: Vec<String> = ports.iter().map(|p| format!(":{p:04X}")).collect();
    loop {
        let table = fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let held = table.lines().skip(1).any(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            fields.len() > 3 && locals.iter().any(|p| fields[1].ends_with(p)) && fields[3] != "06"
        });
        if !held || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until `port` listens (see [`listening`]).
pub fn wait_listening(port: u16, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !listening(port) {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether `pid` still runs: it exists and is not a zombie waiting for
/// whoever inherited it.
fn running(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

impl Drop for NginxProcess {
    fn drop(&mut self) {
        crate::stop_child(&mut self.child);
    }
}
