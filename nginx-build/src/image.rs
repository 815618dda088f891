//! `image`: the OCI image, built offline with buildah from a root
//! filesystem assembled here: nginx + module + `ingress-controller`
//! (stripped), exactly the shared libraries `ldd` says they load (from this
//! Debian system), Debian's CA bundle and time zones, and an `/etc/passwd`
//! with uid 101. No base image, no registry, no package manager inside: a
//! smaller attack surface and a smaller image than a distribution base.
//!
//! Layout inside the image:
//! - `/usr/local/bin/ingress-controller` (the entrypoint, PID 1);
//! - `/usr/local/nginx/sbin/nginx`, `/usr/local/nginx/modules/*.so`;
//! - `/etc/ingress-controller`: the conf dir (nginx.conf, certificates, the
//!   API token, logs, temp files), the one writable path besides `/tmp`;
//!   mount an `emptyDir` on both with a read-only root filesystem.
//!
//! The result is `build/image/ingress-controller-<version>.oci.tar`, which
//! `podman load` and `docker load` take, and the image stays in buildah's
//! local storage as `localhost/dynamic-balancer/ingress-controller:<version>`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::build::{workspace_root, Artifacts};

pub const IMAGE: &str = "localhost/dynamic-balancer/ingress-controller";
const VERSION: &str = env!("CARGO_PKG_VERSION");
const PACKAGES: &[&str] = &["buildah", "podman", "runc", "uidmap", "fuse-overlayfs", "binutils"];

/// The image's uid and gid, as ingress-nginx's (`www-data`, 101).
const UID: u32 = 101;

pub struct Image {
    pub archive: PathBuf,
    pub reference: String,
    /// Bytes of the root filesystem (the uncompressed image).
    pub size: u64,
}

impl Image {
    pub fn print(&self) {
        println!("image:   {}", self.reference);
        println!("archive: {}", self.archive.display());
        println!("size:    {:.1} MB uncompressed", self.size as f64 / 1e6);
        println!("load it: podman load -i {}", self.archive.display());
    }
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The files `ldd` resolves for `binary`, plus the dynamic loader.
fn shared_libraries(binary: &Path) -> Result<BTreeSet<PathBuf>, String> {
    let text = run(Command::new("ldd").arg(binary))?;
    let mut libs = BTreeSet::new();
    for line in text.lines() {
        // "libssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; vdso has no file.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next().filter(|p| p.starts_with('/')),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.insert(PathBuf::from(p));
        }
    }
    if libs.is_empty() {
        return Err(format!("ldd found no libraries for {}", binary.display()));
    }
    Ok(libs)
}

/// Copies `from` to `root/<to>`, creating parents; `strip` removes debug
/// information (the image needs symbols for backtraces, not DWARF).
fn install(root: &Path, from: &Path, to: &str, strip: bool) -> Result<(), String> {
    let dest = root.join(to.trim_start_matches('/'));
    std::fs::create_dir_all(dest.parent().unwrap()).map_err(|e| e.to_string())?;
    if strip {
        run(Command::new("objcopy").arg("--strip-debug").arg(from).arg(&dest))?;
    } else {
        std::fs::copy(from, &dest).map_err(|e| format!("copy {}: {e}", from.display()))?;
    }
    Ok(())
}

fn write(root: &Path, to: &str, text: &str) -> Result<(), String> {
    let dest = root.join(to.trim_start_matches('/'));
    std::fs::create_dir_all(dest.parent().unwrap()).map_err(|e| e.to_string())?;
    std::fs::write(&dest, text).map_err(|e| format!("write {to}: {e}"))
}

fn dir_size(p: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return 0;
    };
    if meta.is_dir() {
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| dir_size(&e.path()))
            .sum()
    } else {
        meta.len()
    }
}

/// Lays out the root filesystem in `root`.
fn assemble(root: &Path, nginx: &Artifacts, controller: &Path) -> Result<(), String> {
    if root.exists() {
        std::fs::remove_dir_all(root).map_err(|e| e.to_string())?;
    }
    std::fs::create_dir_all(root).map_err(|e| e.to_string())?;
    install(root, controller, "/usr/local/bin/ingress-controller", true)?;
    install(root, &nginx.nginx, "/usr/local/nginx/sbin/nginx", true)?;
    install(
        root,
        &nginx.module,
        &format!("/usr/local/nginx/modules/{}", crate::build::MODULE_FILE),
        true,
    )?;
    let mime = nginx.prefix.join("conf/mime.types");
    if mime.exists() {
        install(root, &mime, "/usr/local/nginx/conf/mime.types", false)?;
    }
    let mut libs = BTreeSet::new();
    for bin in [controller, nginx.nginx.as_path(), nginx.module.as_path()] {
        libs.extend(shared_libraries(bin)?);
    }
    for lib in &libs {
        // The loader's path (/lib64/...) is a symlink on Debian: the file
        // it resolves to goes to the path the binaries ask for.
        let real = std::fs::canonicalize(lib).map_err(|e| format!("{}: {e}", lib.display()))?;
        install(root, &real, &lib.display().to_string(), false)?;
    }
    // Debian's CA bundle (package ca-certificates) and zone data (tzdata).
    install(
        root,
        Path::new("/etc/ssl/certs/ca-certificates.crt"),
        "/etc/ssl/certs/ca-certificates.crt",
        false,
    )?;
    let zoneinfo = Path::new("/usr/share/zoneinfo");
    if zoneinfo.is_dir() {
        run(Command::new("cp")
            .args(["-a", "--dereference"])
            .arg(zoneinfo)
            .arg(root.join("usr/share/")))?;
    }
    write(
        root,
        "/etc/passwd",
        &format!(
            "root:x:0:0:root:/root:/usr/sbin/nologin\nwww-data:x:{UID}:{UID}:www-data:/etc/ingress-controller:/usr/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        ),
    )?;
    write(
        root,
        "/etc/group",
        &format!("root:x:0:\nwww-data:x:{UID}:\nnonroot:x:65532:\nnogroup:x:65534:\n"),
    )?;
    write(
        root,
        "/etc/nsswitch.conf",
        "passwd: files\ngroup: files\nhosts: files dns\n",
    )?;
    for d in ["tmp", "etc/ingress-controller"] {
        std::fs::create_dir_all(root.join(d)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn buildah(args: &[&str]) -> Result<String, String> {
    run(Command::new("buildah").args(args))
}

/// Builds the image from the artifacts already built (nginx + module in
/// `build/nginx`, the controller in `target/release`).
pub fn assemble_and_commit() -> Result<Image, String> {
    let started = Instant::now();
    crate::build::install_packages(PACKAGES)?;
    let ws = workspace_root();
    let nginx = Artifacts::locate();
    let controller = ws.join("target/release/ingress-controller");
    for f in [&nginx.nginx, &nginx.module, &controller] {
        if !f.exists() {
            return Err(format!("{} is missing: build it first", f.display()));
        }
    }
    let out = ws.join("build/image");
    let root = out.join("rootfs");
    assemble(&root, &nginx, &controller)?;
    let size = dir_size(&root);

    let reference = format!("{IMAGE}:{VERSION}");
    let c = buildah(&["from", "--pull-never", "scratch"])?;
    let result = (|| {
        let rootfs = format!("{}/", root.display());
        buildah(&["copy", "--chown", "0:0", &c, &rootfs, "/"])?;
        // The writable paths belong to the runtime user.
        buildah(&[
            "copy",
            "--chown",
            &format!("{UID}:{UID}"),
            "--chmod",
            "0700",
            &c,
            &format!("{}", root.join("etc/ingress-controller").display()),
            "/etc/ingress-controller",
        ])?;
        buildah(&[
            "copy",
            "--chmod",
            "1777",
            &c,
            &format!("{}", root.join("tmp").display()),
            "/tmp",
        ])?;
        let uid = format!("{UID}:{UID}");
        let module_env = format!(
            "DYNBAL_NGINX_MODULE=/usr/local/nginx/modules/{}",
            crate::build::MODULE_FILE
        );
        let version_label = format!("org.opencontainers.image.version={VERSION}");
        buildah(&[
            "config",
            "--user",
            &uid,
            "--workingdir",
            "/etc/ingress-controller",
            "--entrypoint",
            r#"["/usr/local/bin/ingress-controller"]"#,
            "--cmd",
            "",
            "--env",
            "PATH=/usr/local/bin:/usr/local/nginx/sbin:/usr/bin:/bin",
            "--env",
            &module_env,
            "--env",
            "DYNBAL_CONF_DIR=/etc/ingress-controller",
            "--env",
            "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
            "--port",
            "80/tcp",
            "--port",
            "443/tcp",
            "--port",
            "10254/tcp",
            "--label",
            "org.opencontainers.image.title=ingress-controller",
            "--label",
            "org.opencontainers.image.description=nginx with ngx_http_dynamic_balancer_module and its ingress controller",
            "--label",
            &version_label,
            "--label",
            "org.opencontainers.image.licenses=Apache-2.0 AND BSD-2-Clause",
            "--stop-signal",
            "SIGTERM",
            &c,
        ])?;
        buildah(&["commit", "--rm", "--squash", &c, &reference])
    })();
    if result.is_err() {
        let _ = buildah(&["rm", &c]);
    }
    result?;
    let archive = out.join(format!("ingress-controller-{VERSION}.oci.tar"));
    let _ = std::fs::remove_file(&archive);
    buildah(&[
        "push",
        &reference,
        &format!("oci-archive:{}:{reference}", archive.display()),
    ])?;
    eprintln!(
        "nginx-build: image {reference} in {:.1}s: {:.1} MB uncompressed, archive {} ({:.1} MB)",
        started.elapsed().as_secs_f64(),
        size as f64 / 1e6,
        archive.display(),
        std::fs::metadata(&archive).map(|m| m.len()).unwrap_or(0) as f64 / 1e6
    );
    Ok(Image {
        archive,
        reference,
        size,
    })
}

/// `image`: builds nginx + module and the controller, then the image.
pub fn build() -> Result<Image, String> {
    crate::build::build()?;
    let root = workspace_root();
    eprintln!("nginx-build: cargo build --release -p controller");
    let status = crate::cargo::command()
        .args(["build", "--release", "-p", "controller"])
        .current_dir(&root)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build -p controller failed ({status})"));
    }
    assemble_and_commit()
}
