//! Basic-auth user files and client CA bundles on disk, under
//! `<conf-dir>/auth/`: written before
//! the `nginx -t` of a configuration that names them, removed once no
//! running configuration does.
//!
//! nginx's workers read the file on every request, so it must be readable
//! by them: mode 0600 for the controller's own user (nginx runs as the same
//! user in the image and whenever the controller is not root); when the
//! controller runs as root, nginx's workers run as `nobody` (nginx's
//! default `user`), and the files and directory are given to that user.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

pub fn dir(conf_dir: &Path) -> PathBuf {
    conf_dir.join("auth")
}

/// The uid and gid nginx's workers run as when nginx is started by root
/// (`nobody`, from /etc/passwd: getpwnam's static buffer is not safe with
/// the runtime's other threads).
fn workers_owner() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 4 && f[0] == "nobody").then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

fn give(path: &Path, owner: Option<(u32, u32)>) -> anyhow::Result<()> {
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).with_context(|| format!("chown {}", path.display()))?;
    }
    Ok(())
}

/// Writes every file that is not already there with the same contents
/// (a new name for new contents: a file is never rewritten in place).
pub fn write_all(conf_dir: &Path, files: &BTreeMap<String, String>) -> anyhow::Result<()> {
    if files.is_empty() {
        return Ok(());
    }
    let dir = dir(conf_dir);
    let owner = workers_owner();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    give(&dir, owner)?;
    for (name, content) in files {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).is_ok_and(|c| &c == content) {
            continue;
        }
        let tmp = dir.join(format!(".{name}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(content.as_bytes())?;
        f.sync_all()?;
        give(&tmp, owner)?;
        std::fs::rename(&tmp, &path).with_context(|| format!("moving {} into place", path.display()))?;
    }
    Ok(())
}

/// The files of the configuration before the current one: its old workers
/// may still be finishing requests that read them.
static PREVIOUS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// After a reload to a configuration naming `current`: removes the files
/// neither it nor the one before it names.
pub fn remove_stale(conf_dir: &Path, current: &BTreeMap<String, String>) {
    let mut previous = PREVIOUS.lock().unwrap_or_else(|e| e.into_inner());
    if let Ok(entries) = std::fs::read_dir(dir(conf_dir)) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let ours = name.ends_with(".htpasswd") || name.ends_with(".ca.pem");
            if ours && !current.contains_key(&name) && !previous.contains(&name) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    *previous = current.keys().cloned().collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_private_and_stale_ones_go() {
        let conf = tempfile::tempdir().unwrap();
        let mut files = BTreeMap::from([("a-b-1.htpasswd".to_string(), "u:h\n".to_string())]);
        write_all(conf.path(), &files).unwrap();
        remove_stale(conf.path(), &files);
        let path = dir(conf.path()).join("a-b-1.htpasswd");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "u:h\n");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(dir(conf.path())).unwrap().permissions().mode() & 0o777,
            0o700
        );
        files.clear();
        files.insert("a-b-2.htpasswd".into(), "u:i\n".into());
        write_all(conf.path(), &files).unwrap();
        remove_stale(conf.path(), &files);
        // The configuration before keeps its file until the next one.
        assert!(path.exists());
        remove_stale(conf.path(), &files);
        assert!(!path.exists());
        assert!(dir(conf.path()).join("a-b-2.htpasswd").exists());
    }
}
