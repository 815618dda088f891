//! The nginx master: started and supervised by the controller, or run by
//! someone else and found through its pid file.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context as _};
use std::sync::atomic::{AtomicI32, Ordering};

use parking_lot::Mutex;
use tokio::process::{Child, Command};

/// Who runs the master process.
#[derive(Debug, Clone)]
pub enum Mode {
    /// The controller starts nginx in the foreground and restarts it if the
    /// master dies, as ingress-nginx does.
    Supervised,
    /// Someone else runs nginx; its master pid is read from this file at
    /// every reload.
    External { pid_file: PathBuf },
}

/// The Unix socket (in the prefix) the HTTP servers' TLS listener moves to
/// with `--enable-ssl-passthrough`.
pub const HTTPS_SOCKET: &str = "https.sock";
/// The Unix sockets of Gateway TLS listeners' twins for backend TLS
/// (`backend-tls-<port>.sock`, see the template's stream servers).
pub const BACKEND_TLS_SOCKET_PREFIX: &str = "backend-tls-";

/// The longest path nginx can listen on as a Unix socket: `sun_path` holds
/// 108 bytes with the terminating NUL on Linux.
const MAX_SOCKET_PATH: usize = 107;

/// Refuses a configuration directory too long for the sockets nginx
/// listens on inside it (`https.sock`, `backend-tls-<port>.sock`): nginx
/// would fail `nginx -t` only once a Gateway TLS listener or SSL
/// passthrough first needs one, with an error that names no flag.
pub fn check_socket_dir(conf_dir: &Path) -> Result<(), String> {
    let longest = format!("{BACKEND_TLS_SOCKET_PREFIX}65535.sock");
    let len = conf_dir.join(&longest).as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(format!(
            "--conf-dir {} is too long: nginx listens on Unix sockets in it (up to {longest}, {len} bytes in all), and a socket path holds at most {MAX_SOCKET_PATH} bytes; choose a directory of at most {} bytes",
            conf_dir.display(),
            MAX_SOCKET_PATH - longest.len() - 1
        ));
    }
    Ok(())
}

pub struct Nginx {
    binary: PathBuf,
    prefix: PathBuf,
    conf: PathBuf,
    mode: Mode,
    child: Mutex<Option<Child>>,
    /// Process group of the supervised master (its pid), 0 before start.
    group: AtomicI32,
    /// When the supervised master was last started.
    started: Mutex<Option<std::time::Instant>>,
    /// Set by `stop`: from then on nothing starts a master again (a reload
    /// racing the shutdown would otherwise start one that `stop` then waits
    /// for until its timeout).
    stopping: std::sync::atomic::AtomicBool,
    /// Set while a master started on an untested configuration (the first
    /// one, see [`Nginx::start_untested`]) has not yet served: if it exits,
    /// the reload task finds out why instead of the supervisor restarting
    /// it on the same file.
    untested: std::sync::atomic::AtomicBool,
    /// How that master exited, once the supervisor saw it go.
    untested_exit: Mutex<Option<String>>,
}

impl Nginx {
    pub fn new(binary: PathBuf, prefix: PathBuf, conf: PathBuf, mode: Mode) -> Self {
        Nginx {
            binary,
            prefix,
            conf,
            mode,
            child: Mutex::new(None),
            group: AtomicI32::new(0),
            started: Mutex::new(None),
            stopping: std::sync::atomic::AtomicBool::new(false),
            untested: std::sync::atomic::AtomicBool::new(false),
            untested_exit: Mutex::new(None),
        }
    }

    pub fn conf_path(&self) -> &Path {
        &self.conf
    }

    pub fn is_supervised(&self) -> bool {
        matches!(self.mode, Mode::Supervised)
    }

    /// `nginx -t` on `conf`; the error text is nginx's own.
    pub async fn test(&self, conf: &Path) -> anyhow::Result<()> {
        let child = super::reaper::spawn(
            Command::new(&self.binary)
                .arg("-p")
                .arg(&self.prefix)
                .arg("-c")
                .arg(conf)
                .arg("-t")
                .arg("-q")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true),
        )
        .with_context(|| format!("running {} -t", self.binary.display()))?;
        let pid = child.id();
        let out = child.wait_with_output().await;
        if let Some(pid) = pid {
            super::reaper::forget(pid);
        }
        let out = out.with_context(|| format!("running {} -t", self.binary.display()))?;
        if !out.status.success() {
            bail!("nginx -t failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }

    /// The Unix sockets nginx listens on in its prefix: the ssl-passthrough
    /// listener's and the backend TLS twins'.
    fn stale_sockets(&self) -> Vec<std::path::PathBuf> {
        let ours = |name: &str| {
            name == HTTPS_SOCKET || (name.starts_with(BACKEND_TLS_SOCKET_PREFIX) && name.ends_with(".sock"))
        };
        let Ok(entries) = std::fs::read_dir(&self.prefix) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(ours))
            .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
            .map(|e| e.path())
            .collect()
    }

    /// Starts the master in the foreground (the template says `daemon off`).
    pub fn start(&self) -> anyhow::Result<u32> {
        if self.stopping.load(Ordering::Acquire) {
            bail!("not starting nginx: the controller is stopping");
        }
        // nginx unlinks a Unix listener's file only on a clean exit, and
        // never before binding it: after a master killed by a signal (or a
        // container restart on the same emptyDir) the ssl-passthrough and
        // backend TLS sockets would fail every start with EADDRINUSE. No
        // master of ours runs now, so the files are stale.
        for socket in self.stale_sockets() {
            if let Err(e) = std::fs::remove_file(&socket) {
                tracing::warn!(path = %socket.display(), error = %e, "cannot remove a stale socket");
            }
        }
        let child = super::reaper::spawn(
            Command::new(&self.binary)
                .arg("-p")
                .arg(&self.prefix)
                .arg("-c")
                .arg(&self.conf)
                .stdin(Stdio::null())
                // Its own process group, so the workers of a master that
                // died can be found and stopped before a new master binds
                // the ports.
                .process_group(0)
                .kill_on_drop(true),
        )
        .with_context(|| format!("starting {}", self.binary.display()))?;
        let pid = child.id().unwrap_or(0);
        self.group.store(pid as i32, Ordering::Release);
        *self.child.lock() = Some(child);
        *self.started.lock() = Some(std::time::Instant::now());
        tracing::info!(pid, "nginx master started");
        Ok(pid)
    }

    /// Starts the master on a configuration `nginx -t` has not checked.
    /// Parsing nginx.conf twice (`-t`, then the start) was a large part of
    /// the first configuration's time with many servers, and a bad first
    /// configuration only makes this start fail: the caller then tests it
    /// and quarantines as after a failed `-t`. Until [`Nginx::prove`] an
    /// exit of this master is the caller's to handle, not the supervisor's.
    pub fn start_untested(&self) -> anyhow::Result<u32> {
        *self.untested_exit.lock() = None;
        self.untested.store(true, Ordering::Release);
        let started = self.start();
        if started.is_err() {
            self.untested.store(false, Ordering::Release);
        }
        started
    }

    /// The master [`Nginx::start_untested`] started serves: the supervisor
    /// restarts it from now on. Fails with its exit status if it exited
    /// first (whichever of the two sees it first decides).
    pub fn prove(&self) -> Result<(), String> {
        match self
            .untested
            .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(_) => Err(self.untested_exit.lock().clone().unwrap_or_default()),
        }
    }

    /// For the supervisor: takes the exit of an untested master (returns
    /// true; [`Nginx::untested_exit`] then reports `status`), or returns
    /// false for any other master, which it restarts.
    pub fn claim_untested_exit(&self, status: &str) -> bool {
        let mut exit = self.untested_exit.lock();
        let claimed = self
            .untested
            .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if claimed {
            *exit = Some(status.to_string());
        }
        claimed
    }

    /// How the untested master exited, once it has.
    pub fn untested_exit(&self) -> Option<String> {
        self.untested_exit.lock().clone()
    }

    /// How long the supervised master has been (or was) running.
    pub fn uptime(&self) -> Duration {
        self.started.lock().map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// The master's pid, if it is running.
    pub fn master_pid(&self) -> Option<i32> {
        match &self.mode {
            Mode::Supervised => self.child.lock().as_ref().and_then(Child::id).map(|p| p as i32),
            Mode::External { pid_file } => std::fs::read_to_string(pid_file).ok()?.trim().parse().ok(),
        }
    }

    fn signal(&self, sig: libc::c_int) -> anyhow::Result<()> {
        let Some(pid) = self.master_pid() else {
            bail!("nginx is not running (no master pid)");
        };
        // SAFETY: kill(2) with a pid we started or read from nginx's pid file.
        if unsafe { libc::kill(pid, sig) } != 0 {
            bail!("signalling nginx master {pid}: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Asks the master to re-read nginx.conf (SIGHUP): new workers start
    /// with the new configuration, old ones finish their requests.
    pub fn reload(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGHUP)
    }

    /// Waits for the supervised master to exit; returns its status text.
    /// Pending forever in external mode (nothing to supervise).
    pub async fn wait_exit(&self) -> String {
        if !self.is_supervised() {
            return std::future::pending().await;
        }
        loop {
            let done = {
                let mut guard = self.child.lock();
                match guard.as_mut().map(Child::try_wait) {
                    Some(Ok(Some(status))) => {
                        guard.take();
                        // tokio has waited for it: the pid may be reused.
                        super::reaper::forget(self.group.load(Ordering::Acquire) as u32);
                        self.kill_orphaned_workers();
                        Some(status.to_string())
                    }
                    Some(Err(e)) => Some(e.to_string()),
                    _ => None,
                }
            };
            if let Some(s) = done {
                return s;
            }
            // Short, so a killed master is noticed (and restarted) fast.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Workers outlive a master killed with SIGKILL and keep the listening
    /// sockets; a new master could not bind them. They share the master's
    /// process group, so that group is killed once the master is gone.
    fn kill_orphaned_workers(&self) {
        let group = self.group.swap(0, Ordering::AcqRel);
        if group > 0 {
            // SAFETY: kill(2) on the process group we created for nginx.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
    }

    /// Graceful stop (SIGQUIT), then SIGKILL after `grace`.
    pub async fn stop(&self, grace: Duration) {
        if !self.is_supervised() {
            return;
        }
        self.stopping.store(true, Ordering::Release);
        if self.signal(libc::SIGQUIT).is_err() {
            return;
        }
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline {
            let exited = matches!(
                self.child.lock().as_mut().map(Child::try_wait),
                Some(Ok(Some(_))) | None
            );
            if exited {
                tracing::info!("nginx stopped");
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.signal(libc::SIGKILL);
        tracing::warn!("nginx did not stop within {grace:?}; killed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conf_dir_must_leave_room_for_its_sockets() {
        assert!(check_socket_dir(Path::new("/etc/nginx")).is_ok());
        let longest_ok = format!("/{}", "d".repeat(83));
        assert!(check_socket_dir(Path::new(&longest_ok)).is_ok());
        let too_long = format!("/{}", "d".repeat(84));
        let e = check_socket_dir(Path::new(&too_long)).unwrap_err();
        assert!(e.contains("--conf-dir") && e.contains("at most 84 bytes"), "{e}");
    }
}
