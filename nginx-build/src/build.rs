//! The offline build of nginx + module.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use std::{env, fs};

/// Debian packages the vendored build needs: bindgen's libclang, and the
/// libraries nginx's configure links (PCRE2 for the rewrite module, OpenSSL,
/// zlib), and the openssl tool the tests use to make a throwaway certificate.
pub const DEBIAN_PACKAGES: &[&str] = &[
    "libclang-dev",
    "libpcre2-dev",
    "libssl-dev",
    "zlib1g-dev",
    "pkg-config",
    "make",
    "openssl",
    // applies nginx-build/patches to the shipped nginx (patched.rs)
    "patch",
];

/// Debian packages README's test command needs on top of the build's:
/// Prometheus and promtool, which `tests/tests/dashboards.rs` runs against
/// the controller (ingress-nginx's dashboards and alert rules).
pub const TEST_PACKAGES: &[&str] = &["prometheus"];

/// Debian packages this target needs on top of the vendored build's: the
/// distribution's nginx tree and the tools that compute a package's
/// library dependencies.
const DEB_PACKAGES: &[&str] = &["nginx-dev", "dpkg-dev", "binutils"];

/// Every Debian package `nginx-build deb` needs: the vendored build's and this target's.
pub fn deb_packages() -> Vec<&'static str> {
    DEBIAN_PACKAGES.iter().chain(DEB_PACKAGES).copied().collect()
}

pub const MODULE_FILE: &str = "ngx_http_dynamic_balancer_module.so";

/// Which nginx + module to build.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The product: `build/nginx`.
    Release,
    /// nginx with AddressSanitizer (GCC's, `-DNGX_DEBUG_PALLOC` so every
    /// pool allocation is its own, checked, block) and the module with
    /// rustc's `-Zsanitizer=address`: `build/nginx-asan`.
    Asan,
}

/// Host triple; sanitizer builds need an explicit `--target`, so that build
/// scripts and proc-macros are not instrumented.
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// Where the build puts things.
pub struct Artifacts {
    pub prefix: PathBuf,
    pub nginx: PathBuf,
    pub module: PathBuf,
}

impl Artifacts {
    pub fn locate() -> Artifacts {
        Self::locate_variant(Variant::Release)
    }

    pub fn locate_variant(variant: Variant) -> Artifacts {
        let dir = match variant {
            Variant::Release => "build/nginx",
            Variant::Asan => "build/nginx-asan",
        };
        let prefix = workspace_root().join(dir);
        Artifacts {
            nginx: prefix.join("sbin/nginx"),
            module: prefix.join("modules").join(MODULE_FILE),
            prefix,
        }
    }

    pub fn print(&self) {
        println!("nginx:  {}", self.nginx.display());
        println!("module: {}", self.module.display());
        println!("use it: load_module {};", self.module.display());
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Where tools built once per machine live (mdBook, kopium, the Go-built
/// Kubernetes binaries): `${DYNBAL_CACHE:-~/.cache/dynamic-balancer}`.
pub fn tool_cache() -> Result<PathBuf, String> {
    std::env::var_os("DYNBAL_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dynamic-balancer")))
        .ok_or_else(|| "neither DYNBAL_CACHE nor HOME is set".to_string())
}

pub fn build() -> Result<Artifacts, String> {
    build_variant(Variant::Release)
}

pub fn build_variant(variant: Variant) -> Result<Artifacts, String> {
    let started = Instant::now();
    install_debian_packages()?;
    let root = workspace_root();
    let mut cmd = crate::cargo::command();
    cmd.args(["build", "--release", "-p", "ngx-module"]).current_dir(&root);
    let (build_dir, module) = match variant {
        Variant::Release => {
            eprintln!(
                "nginx-build: cargo build --release -p ngx-module (builds nginx 1.28.3 from the nginx-src crate)"
            );
            (
                root.join("target/release/build"),
                root.join("target/release/libngx_http_dynamic_balancer_module.so"),
            )
        }
        Variant::Asan => {
            eprintln!("nginx-build: AddressSanitizer build of nginx and the module in target/asan");
            let target = root.join("target/asan");
            cmd.args(["--target", TRIPLE])
                .env("CARGO_TARGET_DIR", &target)
                // The stable toolchain takes -Z flags with this; the
                // sanitizer runtime is nginx's (GCC's libasan).
                .env("RUSTC_BOOTSTRAP", "1")
                .env("RUSTFLAGS", "-Zsanitizer=address -Cforce-frame-pointers=yes")
                .env(
                    "NGX_CFLAGS",
                    "-fsanitize=address -fno-omit-frame-pointer -g -O1 -DNGX_DEBUG_PALLOC=1",
                )
                .env("NGX_LDFLAGS", "-fsanitize=address");
            (
                target.join(TRIPLE).join("release/build"),
                target
                    .join(TRIPLE)
                    .join("release/libngx_http_dynamic_balancer_module.so"),
            )
        }
    };
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build failed ({status})"));
    }
    let objs = newest_nginx_objs(&build_dir)?;
    // The shipped nginx carries nginx-build/patches; the sanitizer build
    // checks the module and runs the vendored nginx as it is.
    let nginx = match variant {
        Variant::Release => crate::patched::build(
            &objs.join("nginx"),
            &root.join("nginx-build/patches"),
            &root.join("target/nginx-patched"),
        )?,
        Variant::Asan => objs.join("nginx"),
    };
    let out = Artifacts::locate_variant(variant);
    for dir in ["sbin", "modules", "conf", "logs"] {
        fs::create_dir_all(out.prefix.join(dir)).map_err(|e| format!("mkdir {dir}: {e}"))?;
    }
    copy(&nginx, &out.nginx)?;
    copy(&module, &out.module)?;
    if let Some(mime) = nginx_source_conf(&objs)
        .map(|c| c.join("mime.types"))
        .filter(|p| p.exists())
    {
        copy(&mime, &out.prefix.join("conf/mime.types"))?;
    }
    let version = Command::new(&out.nginx)
        .arg("-v")
        .output()
        .map_err(|e| format!("cannot run nginx: {e}"))?;
    eprintln!(
        "nginx-build: {} in {:.1}s",
        String::from_utf8_lossy(&version.stderr).trim(),
        started.elapsed().as_secs_f64()
    );
    Ok(out)
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    // Write beside the target and rename, so a running nginx keeps its inode.
    let tmp = to.with_extension("tmp");
    fs::copy(from, &tmp).map_err(|e| format!("copy {}: {e}", from.display()))?;
    fs::rename(&tmp, to).map_err(|e| format!("rename {}: {e}", to.display()))
}

/// `target/release/build/nginx-sys-*/out/objs` holding the newest nginx binary.
fn newest_nginx_objs(build_dir: &Path) -> Result<PathBuf, String> {
    let entries = fs::read_dir(build_dir).map_err(|e| format!("{}: {e}", build_dir.display()))?;
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("nginx-sys-"))
        .map(|e| e.path().join("out/objs"))
        .filter_map(|objs| Some((fs::metadata(objs.join("nginx")).ok()?.modified().ok()?, objs)))
        .max()
        .map(|(_, objs)| objs)
        .ok_or_else(|| "no nginx binary under target/release/build/nginx-sys-*/out/objs".into())
}

/// The `conf/` directory of the nginx source the build used.
fn nginx_source_conf(objs: &Path) -> Option<PathBuf> {
    Some(crate::patched::source_root(objs)?.join("conf"))
}

fn install_debian_packages() -> Result<(), String> {
    let all: Vec<&str> = DEBIAN_PACKAGES.iter().chain(TEST_PACKAGES).copied().collect();
    install_packages(&all)
}

/// Installs the Debian packages of `packages` that are missing (apt-get,
/// as root or through sudo).
pub fn install_packages(packages: &[&str]) -> Result<(), String> {
    if !Path::new("/usr/bin/dpkg-query").exists() {
        eprintln!(
            "nginx-build: not a Debian system; make sure these are installed: {}",
            packages.join(" ")
        );
        return Ok(());
    }
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            let out = Command::new("dpkg-query")
                .args(["-W", "-f=${db:Status-Status}", p])
                .output();
            !matches!(out, Ok(o) if o.stdout == b"installed")
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("nginx-build: installing Debian packages: {}", missing.join(" "));
    let sudo = if is_root() { vec![] } else { vec!["sudo"] };
    let run = |args: &[&str]| -> Result<(), String> {
        let mut argv = sudo.clone();
        argv.extend_from_slice(args);
        let status = Command::new(argv[0])
            .args(&argv[1..])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("cannot run {}: {e}", argv.join(" ")))?;
        status
            .success()
            .then_some(())
            .ok_or_else(|| format!("{} failed ({status})", argv.join(" ")))
    };
    run(&["apt-get", "update", "-qq"])?;
    let mut install = vec!["apt-get", "install", "-y", "-qq", "--no-install-recommends"];
    install.extend(&missing);
    run(&install)
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}
