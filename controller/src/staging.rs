//! The directory where candidate configurations wait for `nginx -t`.
//!
//! Between the moment the controller writes a candidate and the moment
//! nginx reads it, nobody else may change it: a process that could would
//! choose what nginx loads. The controller's directory may be a volume
//! others can write (an `emptyDir` is created world-writable), so
//! candidates go to a subdirectory the controller makes itself, mode 0700,
//! and that it checks is its own (a directory, not a link, owned by the
//! controller's user) before every use.

use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The staging directory's name inside the controller's directory.
pub const DIR: &str = ".staging";

/// Makes (or checks) `<conf_dir>/.staging` and returns its path.
pub fn prepare(conf_dir: &Path) -> anyhow::Result<PathBuf> {
    let dir = conf_dir.join(DIR);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    verify(&dir)?;
    Ok(dir)
}

/// Whether `dir` is still a directory only this process's user can write;
/// a directory of ours with looser permissions is tightened.
pub fn verify(dir: &Path) -> anyhow::Result<()> {
    let meta = std::fs::symlink_metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    if !meta.file_type().is_dir() {
        anyhow::bail!(
            "{} is not a directory (a link?): refusing to stage configurations there",
            dir.display()
        );
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        anyhow::bail!(
            "{} belongs to uid {}, not to this controller (uid {me}): refusing to stage configurations there",
            dir.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_is_private_and_ours() {
        let conf = tempfile::tempdir().unwrap();
        let dir = prepare(conf.path()).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        // Loosened by someone: tightened again.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        prepare(conf.path()).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        // Replaced by a link: refused.
        std::fs::remove_dir(&dir).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &dir).unwrap();
        assert!(prepare(conf.path())
            .unwrap_err()
            .to_string()
            .contains("not a directory"));
    }
}
