//! A reader-writer lock for memory shared by processes (nginx's zone), which
//! survives the death of any holder.
//!
//! nginx's own `ngx_rwlock` keeps readers as one anonymous count: a worker
//! that dies while reading (an abort, `kill -9`, the OOM killer) leaves the
//! count raised forever, and every later writer waits forever. Here each
//! process reads through a slot of its own (pid, start time, hold count), in
//! the manner of a "big-reader" lock:
//!
//! - a reader raises its own slot's count, then checks that no writer holds
//!   the lock (and steps back and waits if one does);
//! - a writer claims the writer word with its pid, then waits until every
//!   slot's count is zero.
//!
//! A waiter that has waited long checks whether the process it waits for
//! is still alive (`kill(pid, 0)`, and the start time in `/proc`, so a
//! reused pid is not taken for the dead holder); a dead holder's hold is
//! cleared. Readers of different workers touch different cache lines, so
//! the uncontended read path is two atomic operations on memory no other
//! process writes.
//!
//! Both sides spin briefly and then `sched_yield`, as `ngx_rwlock` does: the
//! writer may be a low-priority thread, and a reader on an event loop must
//! let it run rather than spin while it is preempted.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

/// Reader slots; index 0 is shared by processes that find no free slot
/// (its holds cannot be recovered, which is logged by the caller).
pub const READER_SLOTS: usize = 256;
/// Spins between liveness checks of a holder we wait for.
const YIELDS_PER_CHECK: u32 = 1024;

#[repr(C, align(64))]
struct ReaderSlot {
    pid: AtomicI64,
    start: AtomicU64,
    holds: AtomicU32,
}

#[repr(C)]
pub struct ShmRwLock<T> {
    writer: AtomicI64,
    writer_start: AtomicU64,
    /// Holders found dead and cleared, for the status page.
    recovered: AtomicU64,
    readers: [ReaderSlot; READER_SLOTS],
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through the guards, which the lock
// protocol makes exclusive (write) or shared (read).
unsafe impl<T: Send> Sync for ShmRwLock<T> {}

/// This process's slot: (pid it was claimed for, index). A forked child
/// inherits the parent's value, so the pid is checked before use.
static MY_SLOT: AtomicU64 = AtomicU64::new(0);
/// The slot index of the process when it has none of its own.
const SHARED_SLOT: usize = 0;

fn pid() -> i64 {
    // SAFETY: getpid has no preconditions.
    i64::from(unsafe { libc::getpid() })
}

/// A process's start time (clock ticks after boot, `/proc/<pid>/stat`
/// field 22), which tells a live holder from a later process with its pid.
/// `None` where `/proc` cannot be read.
pub fn start_time(pid: i64) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is parenthesised and may hold spaces.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(19)?.parse().ok()
}

/// Whether the process `pid` that started at `start` is still running.
pub fn alive(pid: i64, start: u64) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let exists = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    exists && (start == 0 || start_time(pid).is_none_or(|s| s == start))
}

fn relax(spins: &mut u32) {
    if *spins < 64 {
        for _ in 0..(1 << (*spins).min(6)) {
            std::hint::spin_loop();
        }
    } else {
        std::thread::yield_now();
    }
    *spins = spins.saturating_add(1);
}

impl<T> ShmRwLock<T> {
    pub fn new(value: T) -> Self {
        ShmRwLock {
            writer: AtomicI64::new(0),
            writer_start: AtomicU64::new(0),
            recovered: AtomicU64::new(0),
            readers: std::array::from_fn(|_| ReaderSlot {
                pid: AtomicI64::new(0),
                start: AtomicU64::new(0),
                holds: AtomicU32::new(0),
            }),
            value: UnsafeCell::new(value),
        }
    }

    /// Initialises a lock in place, in zeroed shared memory, without
    /// building the large value on the stack first.
    ///
    /// # Safety
    /// `at` points to writable, zeroed memory for a `ShmRwLock<T>`.
    pub unsafe fn init_in_place(at: *mut Self, value: T) {
        // SAFETY: all-zero is the unlocked state of every atomic field; the
        // caller guarantees the memory is zeroed and ours.
        unsafe { std::ptr::addr_of_mut!((*at).value).write(UnsafeCell::new(value)) };
    }

    /// This process's reader slot, claiming one on first use. The fast
    /// path makes no system call: the cache is cleared in forked children
    /// (`pthread_atfork`), so a cached pid is always this process's.
    fn my_slot(&self) -> &ReaderSlot {
        let cached = MY_SLOT.load(Ordering::Relaxed);
        let (owner, index) = ((cached >> 16) as i64, (cached & 0xffff) as usize);
        // The slot must still be ours in this lock: a process may see more
        // than one lock.
        if cached != 0 && index != SHARED_SLOT && self.readers[index].pid.load(Ordering::Relaxed) == owner {
            return &self.readers[index];
        }
        static AT_FORK: std::sync::Once = std::sync::Once::new();
        AT_FORK.call_once(|| {
            extern "C" fn forget_slot() {
                MY_SLOT.store(0, Ordering::Relaxed);
            }
            // SAFETY: registers a handler that only stores to an atomic.
            unsafe { libc::pthread_atfork(None, None, Some(forget_slot)) };
        });
        let me = pid();
        let index = self.claim(me);
        MY_SLOT.store(((me as u64) << 16) | index as u64, Ordering::Relaxed);
        &self.readers[index]
    }

    fn claim(&self, me: i64) -> usize {
        let start = start_time(me).unwrap_or(0);
        let take = |slot: &ReaderSlot, from: i64| {
            slot.pid
                .compare_exchange(from, me, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
                .then(|| slot.start.store(start, Ordering::Release))
                .is_some()
        };
        for (i, slot) in self.readers.iter().enumerate().skip(1) {
            if slot.pid.load(Ordering::Acquire) == me || take(slot, 0) {
                return i;
            }
        }
        // Full: take over a slot whose process is gone and holds nothing.
        for (i, slot) in self.readers.iter().enumerate().skip(1) {
            let pid = slot.pid.load(Ordering::Acquire);
            if slot.holds.load(Ordering::Acquire) == 0
                && !alive(pid, slot.start.load(Ordering::Acquire))
                && take(slot, pid)
            {
                return i;
            }
        }
        SHARED_SLOT
    }

    /// Gives this process's slot back (worker exit). Holding nothing is the
    /// caller's promise.
    pub fn release_slot(&self) {
        let me = pid();
        for slot in self.readers.iter().skip(1) {
            if slot.pid.load(Ordering::Acquire) == me {
                slot.holds.store(0, Ordering::Release);
                slot.pid.store(0, Ordering::Release);
            }
        }
        MY_SLOT.store(0, Ordering::Relaxed);
    }

    /// Waits while a writer holds the lock; clears a dead writer.
    fn wait_for_writer(&self) {
        let mut spins = 0u32;
        loop {
            let w = self.writer.load(Ordering::SeqCst);
            if w == 0 {
                return;
            }
            relax(&mut spins);
            if spins.is_multiple_of(YIELDS_PER_CHECK)
                && !alive(w, self.writer_start.load(Ordering::Acquire))
                && self
                    .writer
                    .compare_exchange(w, 0, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
            {
                self.recovered.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn read(&self) -> ReadGuard<'_, T> {
        let slot = self.my_slot();
        loop {
            slot.holds.fetch_add(1, Ordering::SeqCst);
            if self.writer.load(Ordering::SeqCst) == 0 {
                return ReadGuard { lock: self, slot };
            }
            slot.holds.fetch_sub(1, Ordering::SeqCst);
            self.wait_for_writer();
        }
    }

    pub fn write(&self) -> WriteGuard<'_, T> {
        let me = pid();
        loop {
            if self
                .writer
                .compare_exchange(0, me, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                break;
            }
            self.wait_for_writer();
        }
        self.writer_start.store(start_time(me).unwrap_or(0), Ordering::Release);
        for (i, slot) in self.readers.iter().enumerate() {
            let mut spins = 0u32;
            while slot.holds.load(Ordering::SeqCst) != 0 {
                relax(&mut spins);
                if i != SHARED_SLOT && spins.is_multiple_of(YIELDS_PER_CHECK) {
                    let pid = slot.pid.load(Ordering::Acquire);
                    if pid != me && !alive(pid, slot.start.load(Ordering::Acquire)) {
                        // It died reading: its holds will never be released.
                        slot.holds.store(0, Ordering::SeqCst);
                        let _ = slot.pid.compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed);
                        self.recovered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        WriteGuard(self)
    }

    /// The value without locking, for the one writer that already excludes
    /// every other writer by other means (see the module's `store::apply`).
    pub fn data_ptr(&self) -> *mut T {
        self.value.get()
    }

    /// Holders that died with the lock and were cleared.
    pub fn recovered(&self) -> u64 {
        self.recovered.load(Ordering::Relaxed)
    }

    /// Processes that read without a slot of their own.
    pub fn shared_slot_users(&self) -> bool {
        self.readers[SHARED_SLOT].holds.load(Ordering::Relaxed) != 0
    }
}

pub struct ReadGuard<'a, T> {
    lock: &'a ShmRwLock<T>,
    slot: &'a ReaderSlot,
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: shared access while our hold keeps writers out.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    fn drop(&mut self) {
        self.slot.holds.fetch_sub(1, Ordering::SeqCst);
    }
}

pub struct WriteGuard<'a, T>(&'a ShmRwLock<T>);

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: exclusive access under the write lock.
        unsafe { &*self.0.value.get() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: exclusive access under the write lock.
        unsafe { &mut *self.0.value.get() }
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    fn drop(&mut self) {
        self.0.writer.store(0, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A lock in a file mapped MAP_SHARED, as nginx's zone is shared, so
    /// that another process can map the same lock.
    fn map_lock(path: &std::path::Path, create: bool) -> &'static ShmRwLock<u64> {
        use std::os::fd::AsRawFd;
        let size = std::mem::size_of::<ShmRwLock<u64>>();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(create)
            .open(path)
            .unwrap();
        if create {
            file.set_len(size as u64).unwrap();
        }
        // SAFETY: a shared mapping of a file we sized; zero-filled when new;
        // leaked for the test's lifetime.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let lock = p.cast::<ShmRwLock<u64>>();
            if create {
                ShmRwLock::init_in_place(lock, 0);
            }
            &*lock
        }
    }

    fn shared_lock() -> (&'static ShmRwLock<u64>, tempfile_path::TempPath) {
        let path = tempfile_path::TempPath::new();
        (map_lock(&path.0, true), path)
    }

    mod tempfile_path {
        pub struct TempPath(pub std::path::PathBuf);
        impl TempPath {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let n = N.fetch_add(1, Ordering::Relaxed);
                TempPath(std::env::temp_dir().join(format!("shm-rwlock-{}-{n}", std::process::id())))
            }
        }
        impl Drop for TempPath {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    /// Run in a child process by [`child_holding`]: takes the lock in the
    /// file named by `SHM_RWLOCK_FILE`, says so, and waits to be killed.
    #[test]
    #[ignore = "a helper that child_holding runs in another process"]
    fn holder() {
        let Ok(path) = std::env::var("SHM_RWLOCK_FILE") else {
            return;
        };
        let lock = map_lock(std::path::Path::new(&path), false);
        if std::env::var("SHM_RWLOCK_MODE").as_deref() == Ok("write") {
            std::mem::forget(lock.write());
        } else {
            std::mem::forget(lock.read());
        }
        println!("HELD");
        std::thread::sleep(Duration::from_secs(60));
    }

    /// Another process (this test binary, running [`holder`]) that holds
    /// the lock until killed.
    fn child_holding(path: &tempfile_path::TempPath, write: bool) -> std::process::Child {
        use std::io::BufRead;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "shm_rwlock::tests::holder",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SHM_RWLOCK_FILE", &path.0)
            .env("SHM_RWLOCK_MODE", if write { "write" } else { "read" })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let held = std::io::BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("HELD"));
        assert!(held, "the holder process did not take the lock");
        child
    }

    fn kill(mut child: std::process::Child) {
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn readers_share_and_writers_exclude() {
        let (lock, _file) = shared_lock();
        {
            let a = lock.read();
            let b = lock.read();
            assert_eq!(*a + *b, 0);
        }
        *lock.write() = 7;
        assert_eq!(*lock.read(), 7);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *lock.write() += 1;
                        let _ = *lock.read();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.read(), 40_007);
    }

    #[test]
    fn a_reader_that_dies_holding_the_lock_does_not_block_writers() {
        let (lock, file) = shared_lock();
        let child = child_holding(&file, false);
        kill(child);
        let started = Instant::now();
        *lock.write() = 1;
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(lock.recovered(), 1);
        assert_eq!(*lock.read(), 1);
    }

    #[test]
    fn a_writer_that_dies_holding_the_lock_does_not_block_readers() {
        let (lock, file) = shared_lock();
        let child = child_holding(&file, true);
        kill(child);
        assert_eq!(*lock.read(), 0);
        *lock.write() = 2;
        assert_eq!(lock.recovered(), 1);
    }

    #[test]
    fn a_live_reader_is_waited_for() {
        let (lock, file) = shared_lock();
        let child = child_holding(&file, false);
        let writer = std::thread::spawn(move || {
            *lock.write() = 3;
            Instant::now()
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!writer.is_finished(), "the writer must wait for the live reader");
        let killed = Instant::now();
        kill(child);
        assert!(writer.join().unwrap() >= killed);
    }

    #[test]
    fn start_times_tell_processes_apart() {
        let me = pid();
        let start = start_time(me).unwrap();
        assert!(alive(me, start));
        assert!(!alive(me, start + 1), "a different start time is another process");
        assert!(!alive(0, 0));
    }
}
