//! Replacing a file so that a reader, or the next start after a crash,
//! finds either the old bytes or the new ones, never a mix, even with
//! writers in several processes (each nginx worker writes the state file).
//!
//! A replacement writes `<path>.tmp.<writer>` (created exclusively, mode
//! 0600, in the same directory, so the rename stays on one file system),
//! `fsync`s it, `rename`s it over `<path>` and `fsync`s the directory. An
//! exclusive `flock` on `<path>.lock` is held around all of it, and the
//! caller renders the contents inside the lock: whoever renames last
//! rendered last, so an older state never overwrites a newer one. The
//! kernel drops the lock of a writer that dies, and its temporary file is
//! removed by the next writer's first replacement.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The file's mode: it may describe a private network.
pub const MODE: u32 = 0o600;

/// The step of a replacement that failed, for the log and the status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Step {
    Lock = 1,
    Create = 2,
    Write = 3,
    Sync = 4,
    Rename = 5,
    SyncDir = 6,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Lock => "lock",
            Step::Create => "create",
            Step::Write => "write",
            Step::Sync => "fsync",
            Step::Rename => "rename",
            Step::SyncDir => "fsync directory",
        }
    }

    /// Every step, in the order a replacement takes them.
    pub const ALL: [Step; 6] = [
        Step::Lock,
        Step::Create,
        Step::Write,
        Step::Sync,
        Step::Rename,
        Step::SyncDir,
    ];

    /// The step `value` (`step as u32`) stands for.
    pub fn from_u32(value: u32) -> Option<Step> {
        Step::ALL.into_iter().find(|s| *s as u32 == value)
    }
}

/// A replacement that failed; the file keeps its previous contents.
#[derive(Debug)]
pub struct ReplaceError {
    pub step: Step,
    pub error: io::Error,
}

impl std::fmt::Display for ReplaceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.step.name(), self.error)
    }
}

impl std::error::Error for ReplaceError {}

/// One writer of a file; writers of the same path must have distinct
/// `writer` tags (a pid, say).
pub struct AtomicFile {
    path: PathBuf,
    lock: PathBuf,
    temp: PathBuf,
    dir: PathBuf,
    /// Temporary files left by dead writers were removed.
    swept: AtomicBool,
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(suffix);
    PathBuf::from(s)
}

impl AtomicFile {
    pub fn new(path: impl Into<PathBuf>, writer: &str) -> AtomicFile {
        let path = path.into();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        AtomicFile {
            lock: with_suffix(&path, ".lock"),
            temp: with_suffix(&path, &format!(".tmp.{writer}")),
            path,
            dir,
            swept: AtomicBool::new(false),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Under the lock, asks `contents` for the new bytes (and a value to
    /// hand back) and puts them in place; `None` from `contents` leaves the
    /// file as it is. Blocks while another writer holds the lock.
    pub fn replace<T>(&self, contents: impl FnOnce() -> Option<(Vec<u8>, T)>) -> Result<Option<T>, ReplaceError> {
        let fail = |step| move |error| ReplaceError { step, error };
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.lock)
            .map_err(fail(Step::Lock))?;
        flock(&lock).map_err(fail(Step::Lock))?;
        if !self.swept.swap(true, Ordering::Relaxed) {
            self.sweep();
        }
        let Some((bytes, value)) = contents() else {
            return Ok(None);
        };
        let result = self.write_temp(&bytes).and_then(|()| {
            fs::rename(&self.temp, &self.path).map_err(fail(Step::Rename))?;
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(fail(Step::SyncDir))
        });
        if result.is_err() {
            let _ = fs::remove_file(&self.temp);
        }
        drop(lock);
        result.map(|()| Some(value))
    }

    fn write_temp(&self, bytes: &[u8]) -> Result<(), ReplaceError> {
        let fail = |step| move |error| ReplaceError { step, error };
        let create = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(MODE)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&self.temp)
        };
        let mut file = match create() {
            // Left by a dead writer with our tag (a reused pid): we hold the
            // lock, so no live writer is using it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                fs::remove_file(&self.temp).map_err(fail(Step::Create))?;
                create()
            }
            other => other,
        }
        .map_err(fail(Step::Create))?;
        file.write_all(bytes).map_err(fail(Step::Write))?;
        file.sync_all().map_err(fail(Step::Sync))
    }

    /// Removes temporary files of this path that dead writers left. Only
    /// called under the lock, which every live writer holds while its
    /// temporary file exists.
    fn sweep(&self) {
        let Some(name) = self.path.file_name() else { return };
        let mut prefix = name.to_os_string();
        prefix.push(".tmp.");
        let prefix = prefix.as_encoded_bytes().to_vec();
        let Ok(entries) = fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            if entry.file_name().as_encoded_bytes().starts_with(&prefix) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

/// An exclusive `flock` on `file`, released when it is closed.
fn flock(file: &File) -> io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor `file` owns for the call.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;

    /// A fresh directory under the system's temp dir, removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new() -> Dir {
            static N: AtomicU64 = AtomicU64::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("lua-compat-atomic-{}-{n}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Dir(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn writes_replaces_and_keeps_mode_0600() {
        let dir = Dir::new();
        let path = dir.0.join("state");
        let file = AtomicFile::new(&path, "1");
        assert_eq!(file.replace(|| Some((b"one".to_vec(), 1))).unwrap(), Some(1));
        assert_eq!(fs::read(&path).unwrap(), b"one");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, MODE);
        file.replace(|| Some((b"two".to_vec(), ()))).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(names(&dir.0), ["state", "state.lock"], "no temporary file is left");
    }

    #[test]
    fn nothing_to_write_leaves_the_file() {
        let dir = Dir::new();
        let path = dir.0.join("state");
        let file = AtomicFile::new(&path, "1");
        file.replace(|| Some((b"kept".to_vec(), ()))).unwrap();
        assert_eq!(file.replace(|| None::<(Vec<u8>, ())>).unwrap(), None);
        assert_eq!(fs::read(&path).unwrap(), b"kept");
    }

    #[test]
    fn temporary_files_of_dead_writers_are_removed() {
        let dir = Dir::new();
        let path = dir.0.join("state");
        fs::write(dir.0.join("state.tmp.7"), b"half").unwrap();
        fs::write(dir.0.join("state.tmp.99"), b"half").unwrap();
        fs::write(dir.0.join("other.tmp.7"), b"not ours").unwrap();
        AtomicFile::new(&path, "7")
            .replace(|| Some((b"whole".to_vec(), ())))
            .unwrap();
        assert_eq!(names(&dir.0), ["other.tmp.7", "state", "state.lock"]);
        assert_eq!(fs::read(&path).unwrap(), b"whole");
    }

    #[test]
    fn a_missing_directory_fails_at_the_lock_and_a_relative_path_works() {
        let dir = Dir::new();
        let e = AtomicFile::new(dir.0.join("absent/state"), "1")
            .replace(|| Some((b"x".to_vec(), ())))
            .unwrap_err();
        assert_eq!((e.step, e.error.kind()), (Step::Lock, io::ErrorKind::NotFound));
        assert!(e.to_string().starts_with("lock: "), "{e}");
        assert_eq!(AtomicFile::new("state", "1").dir, PathBuf::from("."));
    }

    #[test]
    fn a_directory_in_the_way_fails_at_the_rename_and_leaves_no_temporary_file() {
        let dir = Dir::new();
        let path = dir.0.join("state");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("inside"), b"").unwrap();
        let e = AtomicFile::new(&path, "1")
            .replace(|| Some((b"x".to_vec(), ())))
            .unwrap_err();
        assert_eq!(e.step, Step::Rename);
        assert_eq!(names(&dir.0), ["state", "state.lock"]);
    }

    #[test]
    fn steps_round_trip_through_their_numbers() {
        for step in Step::ALL {
            assert_eq!(Step::from_u32(step as u32), Some(step));
        }
        assert_eq!(Step::from_u32(0), None);
    }

    /// Writers render a shared, increasing counter inside the lock, and a
    /// reader checks every file it sees is whole. At the end the file
    /// holds the highest value: a late writer never put an older one back.
    #[test]
    fn concurrent_writers_leave_the_newest_whole_file() {
        let dir = Dir::new();
        let path = Arc::new(dir.0.join("state"));
        let counter = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        // A self-checking body: the value, then 64 KiB of its last digit.
        let body = |v: u64| {
            let digit = format!("{v}").pop().unwrap();
            format!("{v}:{}", String::from(digit).repeat(64 * 1024)).into_bytes()
        };
        let reader = {
            let (path, done) = (path.clone(), done.clone());
            std::thread::spawn(move || {
                let mut seen = 0;
                let deadline = Instant::now() + Duration::from_secs(30);
                // Until the writers are done, and at least one read: the
                // reader may not be scheduled before they finish.
                while (seen == 0 || !done.load(Ordering::Relaxed)) && Instant::now() < deadline {
                    if let Ok(bytes) = fs::read(&*path) {
                        let text = String::from_utf8(bytes).unwrap();
                        let (v, rest) = text.split_once(':').unwrap();
                        let digit = v.chars().last().unwrap();
                        assert_eq!(rest.len(), 64 * 1024, "a whole file");
                        assert!(rest.chars().all(|c| c == digit), "one writer's bytes");
                        seen += 1;
                    }
                }
                seen
            })
        };
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let (path, counter) = (path.clone(), counter.clone());
                std::thread::spawn(move || {
                    let file = AtomicFile::new(&*path, &w.to_string());
                    for _ in 0..25 {
                        file.replace(|| {
                            let v = counter.fetch_add(1, Ordering::SeqCst) + 1;
                            Some((body(v), ()))
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0, "the reader saw files");
        assert_eq!(fs::read(&*path).unwrap(), body(100));
    }
}
