//! The node's images, built offline with buildah and imported into
//! containerd's `k8s.io` namespace with `ctr images import` (what
//! `kind load` does): no registry anywhere, so every manifest uses
//! `imagePullPolicy: IfNotPresent` and a tag that is not `latest`.
//!
//! - the pause image: Debian's static `catatonit` in its pause mode (`-P`),
//!   under the name containerd pins as the sandbox image;
//! - the backend: `pod-backend` (this crate) and the shared libraries
//!   `ldd` names for it, from scratch;
//! - the project's image: `nginx-build image` leaves it in buildah's
//!   storage; it is exported from there.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Layout, PAUSE_IMAGE};

pub const BACKEND_IMAGE: &str = "localhost/dynbal/pod-backend:1";
pub const CONTROLLER_IMAGE: &str = "localhost/dynamic-balancer/ingress-controller:0.1.0";

/// [`super::run`], its output trimmed (buildah prints ids and names).
fn run(cmd: &mut Command) -> Result<String, String> {
    super::run(cmd).map(|s| s.trim().to_string())
}

fn buildah(args: &[&str]) -> Result<String, String> {
    run(Command::new("buildah").args(args))
}

/// The files `ldd` resolves for `binary`, with the dynamic loader.
fn shared_libraries(binary: &Path) -> Result<BTreeSet<PathBuf>, String> {
    let out = run(Command::new("ldd").arg(binary))?;
    let mut libs = BTreeSet::new();
    for line in out.lines() {
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.insert(PathBuf::from(p));
        }
    }
    Ok(libs)
}

/// Commits a from-scratch image of `files` (host path, image path) with
/// `entrypoint`, and writes it to `archive` as a docker archive.
fn scratch_image(files: &[(PathBuf, String)], entrypoint: &str, reference: &str, archive: &Path) -> Result<(), String> {
    let c = buildah(&["from", "--pull-never", "scratch"])?;
    let result = (|| {
        for (from, to) in files {
            buildah(&["copy", "--chown", "0:0", &c, &from.display().to_string(), to])?;
        }
        buildah(&[
            "config",
            "--entrypoint",
            entrypoint,
            "--cmd",
            "",
            "--user",
            "65532:65532",
            &c,
        ])?;
        buildah(&["commit", "--rm", &c, reference])
    })();
    if result.is_err() {
        let _ = buildah(&["rm", &c]);
    }
    result?;
    export(reference, archive)
}

fn export(reference: &str, archive: &Path) -> Result<(), String> {
    let _ = std::fs::remove_file(archive);
    buildah(&[
        "push",
        reference,
        &format!("docker-archive:{}:{reference}", archive.display()),
    ])
    .map(|_| ())
}

/// The pause image from catatonit.
pub fn pause(l: &Layout, archive: &Path) -> Result<(), String> {
    scratch_image(
        &[(l.bin.join("catatonit"), "/pause".into())],
        r#"["/pause","-P"]"#,
        PAUSE_IMAGE,
        archive,
    )
}

/// The backend image from the `pod-backend` binary.
pub fn backend(binary: &Path, archive: &Path) -> Result<(), String> {
    let mut files = vec![(binary.to_path_buf(), "/pod-backend".to_string())];
    for lib in shared_libraries(binary)? {
        let real = std::fs::canonicalize(&lib).map_err(|e| format!("{}: {e}", lib.display()))?;
        files.push((real, lib.display().to_string()));
    }
    scratch_image(&files, r#"["/pod-backend"]"#, BACKEND_IMAGE, archive)
}

/// The project's image, as `nginx-build image` committed it.
pub fn controller(archive: &Path) -> Result<(), String> {
    export(CONTROLLER_IMAGE, archive)
}

/// Imports a docker archive into containerd's `k8s.io` namespace.
pub fn import(l: &Layout, archive: &Path) -> Result<(), String> {
    run(Command::new(l.bin.join("ctr"))
        .args([
            "--address",
            &l.containerd_socket().display().to_string(),
            "-n",
            "k8s.io",
        ])
        .args(["images", "import"])
        .arg(archive))
    .map(|_| ())
}

/// The image names containerd's `k8s.io` namespace holds.
pub fn list(l: &Layout) -> Result<Vec<String>, String> {
    let out = run(Command::new(l.bin.join("ctr"))
        .args([
            "--address",
            &l.containerd_socket().display().to_string(),
            "-n",
            "k8s.io",
        ])
        .args(["images", "ls", "-q"]))?;
    Ok(out.lines().map(str::to_string).collect())
}

/// The Gateway API conformance suite's echo server (a static Go binary,
/// tests/gateway-conformance/build.sh) under each name the suite's
/// manifests use, one archive per name, in `dir`.
pub fn echo_basic(binary: &Path, references: &[&str], dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut archives = Vec::new();
    for (i, reference) in references.iter().enumerate() {
        let archive = dir.join(format!("echo-basic-{i}.tar"));
        scratch_image(
            &[(binary.to_path_buf(), "/echo-basic".into())],
            r#"["/echo-basic"]"#,
            reference,
            &archive,
        )?;
        archives.push(archive);
    }
    Ok(archives)
}
