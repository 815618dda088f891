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

impl Drop for NginxProcess {
    fn drop(&mut self) {
        crate::stop_child(&mut self.child);
    }
}
