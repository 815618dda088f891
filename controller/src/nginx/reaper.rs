//! Zombie reaping for a controller that runs as PID 1 in a container.
//!
//! In an image whose entrypoint is the controller, every orphan of the
//! container becomes its child: nginx workers left behind by a master that
//! was killed (the supervisor then kills their process group), or anything
//! a `kubectl exec` session started and abandoned. Unreaped, they stay as
//! zombies and use up the pid limit. The controller's own children (the
//! nginx master, `nginx -t` runs) must *not* be reaped here: tokio waits
//! for them and needs their status. So they are spawned through
//! [`spawn`], which records their pid under the same lock the reaper takes,
//! and the reaper only collects zombies it did not start.

use std::collections::BTreeSet;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::process::{Child, Command};

static SPAWNED: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// Spawns `cmd` as a child the reaper leaves to its owner.
pub fn spawn(cmd: &mut Command) -> std::io::Result<Child> {
    let mut set = SPAWNED.lock();
    let child = cmd.spawn()?;
    if let Some(pid) = child.id() {
        set.insert(pid);
    }
    Ok(child)
}

/// Called once the owner has waited for `pid`.
pub fn forget(pid: u32) {
    SPAWNED.lock().remove(&pid);
}

/// Zombie children of this process, from `/proc/<pid>/stat`.
fn zombie_children(me: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // "pid (comm) S ppid ...": comm may hold spaces and parens.
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                return false;
            };
            let mut fields = rest.split_whitespace();
            fields.next() == Some("Z") && fields.next().and_then(|p| p.parse::<u32>().ok()) == Some(me)
        })
        .collect()
}

/// Reaps the zombies this process did not spawn; returns how many.
pub fn reap_orphans() -> usize {
    let me = std::process::id();
    let spawned = SPAWNED.lock();
    let mut reaped = 0;
    for pid in zombie_children(me) {
        if spawned.contains(&pid) {
            continue;
        }
        let mut status = 0;
        // SAFETY: waitpid(2) on a zombie child we did not spawn through
        // `spawn`, so no other owner waits for it.
        if unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) } > 0 {
            reaped += 1;
        }
    }
    reaped
}

/// When this process is PID 1, reaps orphans on every SIGCHLD (and once a
/// second, in case signals coalesced) until the process ends.
pub async fn run_if_init() {
    if std::process::id() != 1 {
        return;
    }
    tracing::info!("running as PID 1: reaping orphaned processes");
    let Ok(mut sigchld) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) else {
        return;
    };
    loop {
        tokio::select! {
            _ = sigchld.recv() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let n = tokio::task::spawn_blocking(reap_orphans).await.unwrap_or(0);
        if n > 0 {
            tracing::debug!(reaped = n, "reaped orphaned processes");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_past_a_command_with_parens() {
        // The parser keys on the last ')'; this process is no zombie.
        assert!(!zombie_children(std::process::id()).contains(&std::process::id()));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn tracked_children_are_left_to_their_owner() {
        let mut child = spawn(Command::new("true").stdin(std::process::Stdio::null())).unwrap();
        let pid = child.id().unwrap();
        // Wait until it is a zombie, then reap: ours must survive.
        for _ in 0..200 {
            if zombie_children(std::process::id()).contains(&pid) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(reap_orphans(), 0);
        assert!(child.wait().await.unwrap().success());
        forget(pid);
        assert!(!SPAWNED.lock().contains(&pid));
    }
}
