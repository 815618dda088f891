//! The state file (`dynamic_balancer_state`): the zone's backends on disk,
//! so that nginx started after a crash routes by them before anyone pushes.
//!
//! Writing. After a write of backends is applied to the zone, the offload
//! thread calls [`changed`], which wakes this worker's state thread and
//! returns: the API answers without waiting for the disk. The thread
//! renders the zone's current backends under its read lock
//! (`lua_compat::state_file`) and replaces the file through
//! `lua_compat::atomic_file` (temporary file, fsync, rename, fsync of the
//! directory, under a `flock` that every worker's thread takes). Rendering
//! inside the lock means whoever renames last wrote the newest state, and
//! a write that finds the file already at the zone's generation does
//! nothing. Writes that come while one is under way are folded into one
//! more. The thread never calls nginx; its log lines are queued and written
//! by the worker's timer ([`drain_log`]). A worker leaving finishes a
//! pending write first ([`flush`]).
//!
//! Reading. `init_module` ([`crate::process::init_module`]) runs in the master after the zones are set up
//! and before any worker exists. When the zone was created in this cycle
//! (a start, or a reload that resized it; a reused zone already holds the
//! backends) and this is not `nginx -t`, the file is read, validated as a
//! POST would be, and applied with `store::apply`. A missing, unreadable,
//! corrupt or refused file is logged and nginx starts with no backends.
//! `ExternalName` names are not resolved in the master (no DNS wait at
//! start, no threads before fork): those backends get their addresses
//! from worker 0's refresher within a second.
//!
//! Certificates and the servers map are never written: their private keys
//! must not reach the disk through the module.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use lua_compat::api::StateFileStatus;
use lua_compat::atomic_file::{AtomicFile, Step};
use ngx::ffi::{ngx_log_t, ngx_uint_t, NGX_LOG_ERR, NGX_LOG_INFO, NGX_LOG_NOTICE};
use ngx::ngx_log_error;

use crate::shm::index::Blob;
use crate::shm::store::{apply, Change, StoreError};
use crate::shm::zone::Zone;

/// Queued log lines are dropped beyond this, should the timer stall.
const MAX_QUEUED_LOG: usize = 100;

/// This worker's writer, set at `init_process` when the file is configured.
static WRITER: OnceLock<Writer> = OnceLock::new();
static LOG: Mutex<Vec<(ngx_uint_t, String)>> = Mutex::new(Vec::new());

struct Writer {
    zone: Zone,
    file: AtomicFile,
    pending: Mutex<Pending>,
    /// Signalled when `dirty` is set and when a write finishes.
    wake: Condvar,
}

#[derive(Default)]
struct Pending {
    /// A write of backends happened since the thread last rendered.
    dirty: bool,
    /// Write even if the zone's record says the file is current: it is
    /// not there (a new path, a deleted file).
    force: bool,
    /// The thread is writing.
    busy: bool,
    started: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn log(level: u32, line: String) {
    let mut queue = lock(&LOG);
    if queue.len() < MAX_QUEUED_LOG {
        queue.push((level as ngx_uint_t, line));
    }
}

/// Writes the queued log lines (on the event loop).
pub fn drain_log(mut write: impl FnMut(ngx_uint_t, &str)) {
    let lines = std::mem::take(&mut *lock(&LOG));
    for (level, line) in lines {
        write(level, &line);
    }
}

/// Makes this worker write the state file at `path` after its writes to
/// `zone`. Called once, at `init_process`; the thread starts on the first
/// write. A zone that holds backends the file lacks (the directive was
/// just added, the path changed, a re-resolution happened, the file was
/// deleted) is written at once, so that a crash before the next write
/// does not lose them.
pub fn start_worker(zone: Zone, path: &Path) {
    let header = zone.header();
    let generation = header.generation.load(Ordering::Acquire);
    let behind = header.state_file.generation.load(Ordering::Acquire) < generation;
    let missing = generation > 0 && std::fs::symlink_metadata(path).is_err();
    let _ = WRITER.set(Writer {
        zone,
        file: AtomicFile::new(path, &std::process::id().to_string()),
        pending: Mutex::new(Pending::default()),
        wake: Condvar::new(),
    });
    if missing || behind {
        schedule(missing);
    }
}

/// A write of backends was applied: write the file soon. Returns at once.
pub fn changed() {
    schedule(false);
}

/// Wakes the thread (starting it on first use); `force`: write even if
/// the zone's record says the file is current.
fn schedule(force: bool) {
    let Some(writer) = WRITER.get() else { return };
    let mut pending = lock(&writer.pending);
    pending.dirty = true;
    pending.force |= force;
    if !pending.started {
        let spawned = std::thread::Builder::new()
            .name("dynbal-state".into())
            .spawn(move || run(writer));
        match spawned {
            Ok(_) => pending.started = true,
            Err(e) => {
                (pending.dirty, pending.force) = (false, false);
                log(
                    NGX_LOG_ERR,
                    format!(
                        "dynamic_balancer: cannot start the state file's thread: {e}; \"{}\" is not written",
                        writer.file.path().display()
                    ),
                );
                return;
            }
        }
    }
    writer.wake.notify_all();
}

/// Waits up to `timeout` for a pending or running write to finish (a
/// worker leaving); false if it did not.
pub fn flush(timeout: Duration) -> bool {
    let Some(writer) = WRITER.get() else { return true };
    let deadline = Instant::now() + timeout;
    let mut pending = lock(&writer.pending);
    while pending.started && (pending.dirty || pending.busy) {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return false;
        };
        pending = writer
            .wake
            .wait_timeout(pending, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    true
}

fn run(writer: &'static Writer) {
    crate::nginx::worker::block_signals();
    // Rendering takes CPU from traffic no more than parsing does (offload).
    // SAFETY: the priority drop affects this thread alone.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
    loop {
        let force = {
            let mut pending = lock(&writer.pending);
            while !pending.dirty {
                pending = writer.wake.wait(pending).unwrap_or_else(|e| e.into_inner());
            }
            pending.dirty = false;
            pending.busy = true;
            std::mem::take(&mut pending.force)
        };
        write_once(writer, force);
        lock(&writer.pending).busy = false;
        writer.wake.notify_all();
    }
}

/// What one write put in the file.
struct Written {
    generation: u64,
    backends: usize,
    bytes: usize,
}

/// Renders the zone's current backends and replaces the file, unless it
/// already holds this generation (and `force` is false).
fn write_once(writer: &Writer, force: bool) {
    let started = Instant::now();
    let header = writer.zone.header();
    let record = &header.state_file;
    let result = writer.file.replace(|| {
        let index = header.index.read();
        // Read under the read lock: a write stores it inside the write lock.
        let generation = header.generation.load(Ordering::Acquire);
        if !force && record.generation.load(Ordering::Acquire) >= generation {
            return None;
        }
        let bytes = lua_compat::state_file::render(generation, index.blobs().map(Blob::json));
        let backends = index.blobs().len();
        drop(index);
        let len = bytes.len();
        Some((
            bytes,
            Written {
                generation,
                backends,
                bytes: len,
            },
        ))
    });
    let path = writer.file.path().display();
    match result {
        Ok(None) => {}
        Ok(Some(w)) => {
            let took = started.elapsed();
            record.generation.fetch_max(w.generation, Ordering::AcqRel);
            record.failed_step.store(0, Ordering::Relaxed);
            record.errno.store(0, Ordering::Relaxed);
            record.write_us.store(took.as_micros() as u64, Ordering::Relaxed);
            log(
                NGX_LOG_INFO,
                format!(
                    "dynamic_balancer: state file \"{path}\" written: generation {}, {} backends, {} bytes in {:.2} ms",
                    w.generation,
                    w.backends,
                    w.bytes,
                    took.as_secs_f64() * 1e3
                ),
            );
        }
        Err(e) => {
            record
                .errno
                .store(e.error.raw_os_error().unwrap_or(0), Ordering::Relaxed);
            record.failed_step.store(e.step as u32, Ordering::Relaxed);
            log(
                NGX_LOG_ERR,
                format!(
                    "dynamic_balancer: cannot write the state file \"{path}\": {e}; it keeps its previous contents"
                ),
            );
        }
    }
}

/// `state_file` of `/configuration/status` for the file at `path`.
pub fn status(zone: &Zone, path: &Path) -> StateFileStatus {
    let record = &zone.header().state_file;
    let errno = record.errno.load(Ordering::Relaxed);
    let error = Step::from_u32(record.failed_step.load(Ordering::Relaxed))
        .map(|step| format!("{}: {}", step.name(), io::Error::from_raw_os_error(errno)));
    StateFileStatus {
        path: path.display().to_string(),
        generation: record.generation.load(Ordering::Acquire),
        error,
        write_us: record.write_us.load(Ordering::Relaxed),
    }
}

/// Reads `path` into `zone`, logging what happened to `log`.
pub fn restore(zone: &Zone, path: &Path, log: *mut ngx_log_t) {
    let started = Instant::now();
    let shown = path.display();
    let bytes = match read_regular(path, zone.size()) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            ngx_log_error!(
                NGX_LOG_NOTICE,
                log,
                "dynamic_balancer: no state file \"{shown}\" yet; starting with no backends"
            );
            return;
        }
        Err(e) => {
            ngx_log_error!(
                NGX_LOG_ERR,
                log,
                "dynamic_balancer: cannot read the state file \"{shown}\": {e}; starting with no backends"
            );
            return;
        }
    };
    let restored = match lua_compat::state_file::parse(&bytes, &mut |_, _| Vec::new()) {
        Ok(r) => r,
        Err(e) => {
            ngx_log_error!(
                NGX_LOG_ERR,
                log,
                "dynamic_balancer: ignoring the state file \"{shown}\": {e}; starting with no backends"
            );
            return;
        }
    };
    let backends = restored.backends.len();
    let endpoints: usize = restored.backends.iter().map(|b| b.endpoints).sum();
    let resolving = restored.backends.iter().filter(|b| b.resolves).count();
    if backends == 0 {
        ngx_log_error!(
            NGX_LOG_NOTICE,
            log,
            "dynamic_balancer: the state file \"{shown}\" holds no backends"
        );
        return;
    }
    match apply(zone, Change::ReplaceAll(restored.backends)) {
        Ok(applied) => {
            // The file holds exactly what the zone now does.
            let record = &zone.header().state_file;
            record.generation.store(applied.generation, Ordering::Release);
            ngx_log_error!(
                NGX_LOG_NOTICE,
                log,
                "dynamic_balancer: restored {backends} backends ({endpoints} endpoints) from the state file \"{shown}\" (written at generation {}) in {:.2} ms",
                restored.generation,
                started.elapsed().as_secs_f64() * 1e3
            );
            if resolving > 0 {
                ngx_log_error!(
                    NGX_LOG_NOTICE,
                    log,
                    "dynamic_balancer: {resolving} restored backends name DNS hosts; they route once resolved, within a second"
                );
            }
        }
        Err(StoreError::ZoneFull { needed, zone }) => {
            ngx_log_error!(
                NGX_LOG_ERR,
                log,
                "dynamic_balancer: the state file \"{shown}\" needs {needed} bytes, more than dynamic_balancer_zone ({zone} bytes) has; starting with no backends"
            );
        }
        Err(e) => {
            ngx_log_error!(
                NGX_LOG_ERR,
                log,
                "dynamic_balancer: the state file \"{shown}\" was not applied ({e:?}); starting with no backends"
            );
        }
    }
}

/// The bytes of the regular file `path`, refused past `limit`. The master
/// reads it as root from a directory the workers' user writes, so a
/// symbolic link there is not followed and a FIFO does not block it.
fn read_regular(path: &Path, limit: usize) -> io::Result<Vec<u8>> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if meta.len() > limit as u64 {
        return Err(io::Error::other(format!(
            "{} bytes, larger than the zone ({limit} bytes)",
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > limit {
        return Err(io::Error::other("larger than the zone"));
    }
    Ok(bytes)
}
