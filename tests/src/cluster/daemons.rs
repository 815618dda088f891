//! The node's processes: started detached (their own process group, so the
//! command that brought the node up can exit and a test's Ctrl-C does not
//! reach them), logging to the run directory, each with a pid file that
//! teardown reads. A pid is signalled only while `/proc/<pid>/exe` is still
//! the binary that was started, so a reused pid is never hit.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Layout;

/// The order they start in; teardown stops them in reverse.
pub const ORDER: [&str; 7] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "containerd",
    "kubelet",
    "kube-proxy",
];

pub fn spawn(l: &Layout, name: &str, program: &Path, args: &[String], env: &[(&str, String)]) -> Result<u32, String> {
    std::fs::create_dir_all(l.logs()).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(l.pids()).map_err(|e| e.to_string())?;
    let log = std::fs::File::create(l.logs().join(format!("{name}.log"))).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().map_err(|e| format!("{}: {e}", program.display()))?;
    let pid = child.id();
    std::fs::write(
        l.pids().join(format!("{name}.pid")),
        format!("{pid}\n{}\n", program.display()),
    )
    .map_err(|e| e.to_string())?;
    // The child is reaped by whoever is init once this process exits; a
    // test that outlives it reaps it in `stop`.
    std::mem::forget(child);
    Ok(pid)
}

/// The pid of `name` if it still runs the binary it was started with.
pub fn running(l: &Layout, name: &str) -> Option<u32> {
    let text = std::fs::read_to_string(l.pids().join(format!("{name}.pid"))).ok()?;
    let mut lines = text.lines();
    let pid: u32 = lines.next()?.trim().parse().ok()?;
    let program = PathBuf::from(lines.next()?.trim());
    alive_as(pid, &program).then_some(pid)
}

/// Whether `pid` runs `program` (and is not a zombie).
pub fn alive_as(pid: u32, program: &Path) -> bool {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = state
        .rsplit(')')
        .next()
        .map(|s| s.trim_start().starts_with('Z'))
        .unwrap_or(true);
    // A binary replaced on disk while running reads as "<path> (deleted)".
    let same = exe
        .is_some_and(|e| e == program || e.as_os_str().to_string_lossy() == format!("{} (deleted)", program.display()));
    same && !zombie
}

fn reap(pid: u32) {
    let mut status = 0;
    // SAFETY: waitpid(2) on a pid; WNOHANG never blocks, and it fails
    // harmlessly (ECHILD) when the pid is not our child.
    unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
}

/// SIGTERM, then SIGKILL after `grace`; waits until the pid is gone.
pub fn stop_pid(pid: u32, program: &Path, grace: Duration) -> bool {
    if !alive_as(pid, program) {
        reap(pid);
        return true;
    }
    // SAFETY: kill(2) on a pid checked above to run our binary.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        reap(pid);
        if !alive_as(pid, program) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    for _ in 0..100 {
        reap(pid);
        if !alive_as(pid, program) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Stops `name` if it runs; removes its pid file.
pub fn stop(l: &Layout, name: &str, grace: Duration) -> Result<(), String> {
    let file = l.pids().join(format!("{name}.pid"));
    let Ok(text) = std::fs::read_to_string(&file) else {
        return Ok(());
    };
    let mut lines = text.lines();
    let pid: u32 = lines.next().and_then(|p| p.trim().parse().ok()).unwrap_or(0);
    let program = PathBuf::from(lines.next().unwrap_or("").trim());
    if pid != 0 && !stop_pid(pid, &program, grace) {
        return Err(format!("{name} (pid {pid}) does not stop"));
    }
    let _ = std::fs::remove_file(file);
    Ok(())
}

/// Pids of every process whose executable is `program` (containerd's
/// shims, which containerd starts detached and which outlive it).
pub fn processes_of(program: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            if let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() {
                if alive_as(pid, program) {
                    out.push(pid);
                }
            }
        }
    }
    out
}

/// Sends SIGKILL to `pid` (a container's process, found in kubelet's
/// cgroups) and does not wait.
pub fn kill_hard(pid: i32) {
    // SAFETY: kill(2); the pid was read from a kubepods cgroup just now.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}
