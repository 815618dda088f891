//! A directory for `dynamic_balancer_state`, laid out as in production:
//! the master (root here) reads the file, the workers (nginx's default
//! `nobody` under a root master) write it, so the directory is theirs.

use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::Nginx;

pub struct StateDir {
    _root: tempfile::TempDir,
    pub dir: PathBuf,
    /// The state file.
    pub path: PathBuf,
}

/// Whether the tests run as root: nginx's master then runs its workers as
/// `nobody`.
pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// uid and gid of the user a root master runs workers as.
pub fn workers_user() -> Option<(libc::uid_t, libc::gid_t)> {
    if !running_as_root() {
        return None; // workers run as we do
    }
    let name = CString::new("nobody").unwrap();
    // SAFETY: getpwnam with a NUL-terminated name; the entry is read at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(!pw.is_null(), "no user nobody for nginx's workers");
    // SAFETY: a non-null entry from getpwnam, read before any other call.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

impl StateDir {
    /// `state/` under a fresh directory, writable by the workers.
    pub fn new() -> StateDir {
        Self::make(true)
    }

    /// `state/` owned by root alone (when the tests run as root): the
    /// workers cannot write there.
    pub fn unwritable() -> StateDir {
        Self::make(false)
    }

    fn make(writable: bool) -> StateDir {
        let root = tempfile::tempdir().unwrap();
        // Others may pass through to `state/`, as through /var/lib.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let dir = root.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        if let (true, Some((uid, gid))) = (writable, workers_user()) {
            let c = CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: chown of a directory we just made, by its NUL-terminated path.
            assert_eq!(unsafe { libc::chown(c.as_ptr(), uid, gid) }, 0, "chown state dir");
        }
        let path = dir.join("dynamic_balancer.state");
        StateDir { _root: root, dir, path }
    }

    /// The directive for `http{}`.
    pub fn directive(&self) -> String {
        format!("dynamic_balancer_state {};", self.path.display())
    }

    /// The file's bytes, if it exists.
    pub fn bytes(&self) -> Option<Vec<u8>> {
        std::fs::read(&self.path).ok()
    }

    /// The file as JSON; panics if it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes().expect("no state file")).expect("state file is JSON")
    }

    /// The canonical JSON of each backend the file holds, after the
    /// module's own validation; panics if it refuses the file.
    pub fn backends(&self) -> Vec<Vec<u8>> {
        backends_of(&self.bytes().expect("no state file"))
    }

    /// Names of the files in the directory, sorted.
    pub fn listing(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Default for StateDir {
    fn default() -> Self {
        Self::new()
    }
}

/// The canonical JSON of each backend in state-file bytes.
pub fn backends_of(bytes: &[u8]) -> Vec<Vec<u8>> {
    lua_compat::state_file::parse(bytes, &mut |_, _| Vec::new())
        .unwrap_or_else(|e| panic!("state file refused: {e}"))
        .backends
        .into_iter()
        .map(|p| p.json)
        .collect()
}

/// The canonical JSON of each backend of a POST body, sorted by name as
/// the zone (and so the file) keeps them.
pub fn canonical(body: &str) -> Vec<Vec<u8>> {
    let mut items = lua_compat::runtime::prepare_backends(body.as_bytes(), &mut |_, _| Vec::new()).unwrap();
    items.sort_by(|a, b| a.name.cmp(&b.name));
    items.into_iter().map(|p| p.json).collect()
}

/// Waits until `/configuration/status` says the file holds the zone's
/// current generation; returns the status.
pub fn wait_written(ng: &Nginx) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = ng.status();
        if s["state_file"]["generation"] == s["generation"] && s["state_file"]["error"].is_null() {
            return s;
        }
        assert!(Instant::now() < deadline, "the state file was not written: {s}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `path` has mode 0600.
pub fn mode_0600(path: &Path) -> bool {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777 == 0o600
}
