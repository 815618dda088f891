//! `nginx-build deb`: the module as a Debian package for the distribution's
//! own nginx, named and laid out as Debian's `libnginx-mod-*` packages are.
//!
//! A dynamic module loads only into an nginx of the same version built with
//! a compatible configure signature (`--with-compat`), and Debian patches
//! its nginx, so the module is built against the distribution's own tree:
//! the `nginx-dev` package ships it unconfigured, with the configure flags
//! of the distribution's binary (`conf_flags`) and the ABI name its nginx
//! provides (`debian/libnginx-mod.abisubstvars`, e.g. `nginx-abi-1.22.1-7`).
//! The tree is copied, configured with those flags, and ngx-rust builds the
//! module against it (`NGINX_BUILD_DIR`, without the `vendored` feature).
//! The package depends on that ABI, so apt refuses it next to any other
//! nginx, and Debian's nginx refuses a module of another version at start
//! with its own message (`module "..." version 1028003 instead of 1022001`).
//!
//! The package (`build/deb/libnginx-mod-http-dynamic-balancer_<v>_<arch>.deb`):
//! - `/usr/lib/nginx/modules/ngx_http_dynamic_balancer_module.so`, stripped;
//! - `/usr/share/nginx/modules-available/mod-http-dynamic-balancer.conf`,
//!   the `load_module` line, linked from `/etc/nginx/modules-enabled/` by
//!   the maintainer scripts as Debian's module packages do;
//! - an example configuration and the copyright under `/usr/share/doc`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use std::{env, fs};

use crate::build::{install_packages, workspace_root, MODULE_FILE};
use crate::chroot::Chroot;

pub const PACKAGE: &str = "libnginx-mod-http-dynamic-balancer";
/// The name of the snippet in `modules-available`, and of its link in
/// `modules-enabled` (after the `50-` priority Debian's modules use).
const SNIPPET: &str = "mod-http-dynamic-balancer.conf";
const ENABLED_LINK: &str = "50-mod-http-dynamic-balancer.conf";
/// The Debian revision of our packaging; bump it when the packaging alone
/// changes.
const DEBIAN_REVISION: &str = "1";
const DEFAULT_NGINX_DEV: &str = "/usr/share/nginx/src";

/// What `deb` made.
pub struct Package {
    pub deb: PathBuf,
    /// The unstripped module, as built (for a test that loads it directly).
    pub module: PathBuf,
    pub nginx_version: String,
    pub abi: String,
}

impl Package {
    pub fn print(&self) {
        println!("package: {}", self.deb.display());
        println!("for:     nginx {} ({})", self.nginx_version, self.abi);
        println!("module:  {} (unstripped)", self.module.display());
        println!("install: apt-get install {}", self.deb.display());
    }
}

/// The distribution's nginx tree, as `nginx-dev` ships it.
struct NginxTree {
    dir: PathBuf,
    version: String,
    abi: String,
}

impl NginxTree {
    fn read(dir: &Path) -> Result<NginxTree, String> {
        let header = fs::read_to_string(dir.join("src/core/nginx.h")).map_err(|e| {
            format!(
                "{}: {e} (is nginx-dev installed?)",
                dir.join("src/core/nginx.h").display()
            )
        })?;
        let version = nginx_version(&header).ok_or("no NGINX_VERSION in src/core/nginx.h")?;
        let substvars = fs::read_to_string(dir.join("debian/libnginx-mod.abisubstvars"))
            .map_err(|e| format!("{}: {e}", dir.join("debian/libnginx-mod.abisubstvars").display()))?;
        let abi = nginx_abi(&substvars).ok_or("no nginx:abi= in debian/libnginx-mod.abisubstvars")?;
        if !dir.join("conf_flags").exists() {
            return Err(format!("{}: no conf_flags", dir.display()));
        }
        Ok(NginxTree {
            dir: dir.to_path_buf(),
            version,
            abi,
        })
    }
}

/// Which nginx a package is for.
enum Target {
    /// This system's, from `nginx-dev` (or another tree of that shape).
    Host { nginx_dev: Option<PathBuf> },
    /// Another Debian suite's, in a chroot (see `chroot.rs`).
    Suite(String),
}

impl Target {
    fn parse(args: &[String]) -> Result<Target, String> {
        match args {
            [] => Ok(Target::Host { nginx_dev: None }),
            [flag, dir] if flag == "--nginx-dev" => Ok(Target::Host {
                nginx_dev: Some(PathBuf::from(dir)),
            }),
            [flag, suite] if flag == "--suite" => Ok(Target::Suite(suite.clone())),
            _ => Err("usage: deb|deb-install [--nginx-dev DIR | --suite SUITE]".into()),
        }
    }

    /// Where `deb-install` lays out nginx and the module for the harness.
    fn prefix(&self) -> PathBuf {
        match self {
            Target::Host { .. } => workspace_root().join(DEBIAN_PREFIX),
            Target::Suite(suite) => workspace_root().join(format!("{DEBIAN_PREFIX}-{suite}")),
        }
    }
}

impl Package {
    /// Reads what [`Package::print`] printed (the chroot's `nginx-build deb`).
    fn parse(printed: &str) -> Result<Package, String> {
        let field = |name: &str| {
            printed
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
                .ok_or_else(|| format!("no {name:?} line in {printed:?}"))
        };
        let target = field("for:")?;
        let (version, abi) = target
            .strip_prefix("nginx ")
            .and_then(|t| t.split_once(" ("))
            .ok_or_else(|| format!("unreadable for: line {target:?}"))?;
        Ok(Package {
            deb: PathBuf::from(field("package:")?),
            module: PathBuf::from(field("module:")?.trim_end_matches(" (unstripped)")),
            nginx_version: version.to_string(),
            abi: abi.trim_end_matches(')').to_string(),
        })
    }
}

/// `cargo run -p nginx-build -- deb [--nginx-dev DIR | --suite SUITE]`.
pub fn build(args: &[String]) -> Result<Package, String> {
    match Target::parse(args)? {
        Target::Host { nginx_dev } => build_here(nginx_dev),
        Target::Suite(suite) => {
            let chroot = Chroot::ensure(&suite)?;
            let printed = chroot.capture(&workspace_root().join("target/release/nginx-build"), &["deb"])?;
            Package::parse(&printed)
        }
    }
}

fn build_here(nginx_dev: Option<PathBuf>) -> Result<Package, String> {
    let started = Instant::now();
    install_packages(&crate::build::deb_packages())?;
    let tree = NginxTree::read(nginx_dev.as_deref().unwrap_or(Path::new(DEFAULT_NGINX_DEV)))?;
    let root = workspace_root();
    let work = root.join("target/debian").join(&tree.abi);
    let objs = configure(&tree, &work.join("nginx"))?;
    let module = build_module(&root, &work.join("target"), &objs)?;
    let deb = assemble(&root, &tree, &module, &work.join("staging"))?;
    eprintln!(
        "nginx-build: {} for nginx {} in {:.1}s",
        deb.display(),
        tree.version,
        started.elapsed().as_secs_f64()
    );
    Ok(Package {
        deb,
        module,
        nginx_version: tree.version,
        abi: tree.abi,
    })
}

/// Where `deb-install` lays out the distribution's nginx and the installed
/// module for the test harness (`DYNBAL_NGINX_PREFIX`).
pub const DEBIAN_PREFIX: &str = "build/nginx-debian";
const DISTRO_NGINX: &str = "/usr/sbin/nginx";
const DISTRO_MODULES: &str = "/usr/lib/nginx/modules";

/// The suites `deb-test` runs on the distribution's nginx by default: the
/// API, balancing, hostile input, restarts and the client.
const DEFAULT_TESTS: &[&str] = &[
    "api",
    "balancing",
    "hostile",
    "lifecycle",
    "upstreams",
    "health",
    "state_file",
    "cli",
];

/// `deb-install`: builds the package, installs it with apt (which brings
/// the distribution's nginx, the package's dependency), and links both
/// into [`DEBIAN_PREFIX`].
pub fn install(args: &[String]) -> Result<Package, String> {
    let target = Target::parse(args)?;
    let package = build(args)?;
    let prefix = target.prefix();
    for dir in ["sbin", "modules", "conf"] {
        fs::create_dir_all(prefix.join(dir)).map_err(|e| format!("mkdir {dir}: {e}"))?;
    }
    let suite = match &target {
        Target::Host { .. } => {
            install_here(&package, &prefix)?;
            "this system".to_string()
        }
        Target::Suite(suite) => {
            let chroot = Chroot::ensure(suite)?;
            chroot.run_shell(&format!(
                "apt-get install -y -qq --reinstall --no-install-recommends {}",
                package.deb.display()
            ))?;
            // The harness loads the module by this path, inside the chroot
            // too (the workspace is mounted there): the installed file.
            let installed = chroot
                .root
                .join(DISTRO_MODULES.trim_start_matches('/'))
                .join(MODULE_FILE);
            let module = prefix.join("modules").join(MODULE_FILE);
            let _ = fs::remove_file(&module);
            fs::copy(&installed, &module).map_err(|e| format!("copy {}: {e}", installed.display()))?;
            let _ = fs::remove_file(prefix.join("sbin/nginx"));
            write(&prefix.join("sbin/nginx"), &chroot.nginx_wrapper(), 0o755)?;
            let _ = fs::remove_file(prefix.join("conf/mime.types"));
            fs::copy(chroot.root.join("etc/nginx/mime.types"), prefix.join("conf/mime.types"))
                .map_err(|e| format!("mime.types: {e}"))?;
            format!("Debian {suite}")
        }
    };
    eprintln!(
        "nginx-build: installed {PACKAGE} for nginx {} on {suite}; {} runs it",
        package.nginx_version,
        prefix.display()
    );
    Ok(package)
}

/// Installs the package with this system's apt (which brings the
/// distribution's nginx) and links both into `prefix`.
fn install_here(package: &Package, prefix: &Path) -> Result<(), String> {
    let sudo: &[&str] = if crate::build::is_root() { &[] } else { &["sudo"] };
    let mut apt = Command::new(sudo.first().copied().unwrap_or("apt-get"));
    if !sudo.is_empty() {
        apt.arg("apt-get");
    }
    // --reinstall: a rebuilt package keeps its version.
    run(apt
        .args(["install", "-y", "-qq", "--reinstall", "--no-install-recommends"])
        .arg(&package.deb)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    relink(Path::new(DISTRO_NGINX), &prefix.join("sbin/nginx"))?;
    relink(
        &Path::new(DISTRO_MODULES).join(MODULE_FILE),
        &prefix.join("modules").join(MODULE_FILE),
    )?;
    relink(Path::new("/etc/nginx/mime.types"), &prefix.join("conf/mime.types"))
}

/// `deb-test [TESTS...]`: the end-to-end suites on the distribution's
/// nginx with the installed package.
pub fn test(args: &[String]) -> Result<(), String> {
    let (target_args, tests) = match args {
        [flag, _suite, rest @ ..] if flag == "--suite" => (&args[..2], rest),
        rest => (&args[..0], rest),
    };
    let package = install(target_args)?;
    let tests: Vec<String> = if tests.is_empty() {
        DEFAULT_TESTS.iter().map(|t| t.to_string()).collect()
    } else {
        tests.to_vec()
    };
    eprintln!(
        "nginx-build: running {} on nginx {}",
        tests.join(", "),
        package.nginx_version
    );
    let status = crate::suites::run(&Target::parse(target_args)?.prefix(), &tests, &[])?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("the tests failed on the distribution's nginx ({status})"))
}

fn relink(target: &Path, link: &Path) -> Result<(), String> {
    if !target.exists() {
        return Err(format!("{} is missing", target.display()));
    }
    let _ = fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).map_err(|e| format!("ln -s {}: {e}", link.display()))
}

/// Copies the tree and runs its configure with the distribution's flags,
/// once per tree: the flags file is kept beside `objs` and compared.
fn configure(tree: &NginxTree, dest: &Path) -> Result<PathBuf, String> {
    let flags = fs::read_to_string(tree.dir.join("conf_flags")).map_err(|e| format!("conf_flags: {e}"))?;
    let objs = dest.join("objs");
    let stamp = dest.join("conf_flags.configured");
    if objs.join("ngx_auto_config.h").exists() && fs::read_to_string(&stamp).ok().as_deref() == Some(&flags) {
        return Ok(objs);
    }
    if dest.exists() {
        fs::remove_dir_all(dest).map_err(|e| format!("rm {}: {e}", dest.display()))?;
    }
    fs::create_dir_all(dest.parent().expect("a parent")).map_err(|e| format!("mkdir: {e}"))?;
    run(Command::new("cp").arg("-r").arg(&tree.dir).arg(dest))?;
    eprintln!("nginx-build: configuring nginx {} with Debian's flags", tree.version);
    // conf_flags is a bash array assignment; bash reads it as Debian's
    // rules file does.
    let log = dest.join("configure.log");
    let status = Command::new("bash")
        .args([
            "-c",
            "source ./conf_flags && ./configure \"${NGX_CONF_FLAGS[@]}\" > configure.log 2>&1",
        ])
        .current_dir(dest)
        .status()
        .map_err(|e| format!("cannot run bash: {e}"))?;
    if !status.success() {
        return Err(format!("configure failed ({status}); see {}", log.display()));
    }
    fs::write(&stamp, flags).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(objs)
}

/// Builds the module against the configured tree, in a target directory of
/// its own (the vendored build's artifacts stay as they are).
fn build_module(root: &Path, target: &Path, objs: &Path) -> Result<PathBuf, String> {
    eprintln!(
        "nginx-build: cargo build --release -p ngx-module --no-default-features (NGINX_BUILD_DIR={})",
        objs.display()
    );
    run(crate::cargo::command()
        .args(["build", "--release", "-p", "ngx-module", "--no-default-features"])
        .env("CARGO_TARGET_DIR", target)
        .env("NGINX_BUILD_DIR", objs)
        .env_remove("NGINX_SOURCE_DIR")
        .current_dir(root))?;
    Ok(target.join("release/libngx_http_dynamic_balancer_module.so"))
}

/// Lays out the package's files and control area, and builds it with
/// `dpkg-deb` into `build/deb/`.
fn assemble(root: &Path, tree: &NginxTree, module: &Path, staging: &Path) -> Result<PathBuf, String> {
    if staging.exists() {
        fs::remove_dir_all(staging).map_err(|e| format!("rm {}: {e}", staging.display()))?;
    }
    let modules = staging.join("usr/lib/nginx/modules");
    let available = staging.join("usr/share/nginx/modules-available");
    let doc = staging.join("usr/share/doc").join(PACKAGE);
    let control = staging.join("DEBIAN");
    for dir in [&modules, &available, &doc.join("examples"), &control] {
        fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    }
    let so = modules.join(MODULE_FILE);
    // Debian ships modules without debug information (it goes to -dbgsym).
    run(Command::new("strip")
        .args(["--strip-debug", "--strip-unneeded", "-o"])
        .arg(&so)
        .arg(module))?;
    set_mode(&so, 0o644)?;
    write(&available.join(SNIPPET), &load_snippet(), 0o644)?;
    write(&doc.join("copyright"), &copyright(), 0o644)?;
    let example = fs::read_to_string(root.join("nginx-build/conf/bare-metal.conf"))
        .map_err(|e| format!("nginx-build/conf/bare-metal.conf: {e}"))?;
    write(&doc.join("examples/dynamic-balancer.conf"), &example, 0o644)?;
    for (name, text) in maintainer_scripts() {
        write(&control.join(name), &text, 0o755)?;
    }
    write(&control.join("md5sums"), &md5sums(staging)?, 0o644)?;

    let fields = ControlFields {
        version: package_version(env!("CARGO_PKG_VERSION"), &tree.abi),
        architecture: capture(Command::new("dpkg").arg("--print-architecture"))?,
        depends: format!("{}, {}", tree.abi, shlib_depends(&so, &root.join("target/debian"))?),
        installed_size_kib: installed_size_kib(staging)?,
        nginx_version: tree.version.clone(),
    };
    write(&control.join("control"), &fields.render(), 0o644)?;
    let out_dir = root.join("build/deb");
    fs::create_dir_all(&out_dir).map_err(|e| format!("mkdir {}: {e}", out_dir.display()))?;
    let deb = out_dir.join(format!("{PACKAGE}_{}_{}.deb", fields.version, fields.architecture));
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(staging)
        .arg(&deb))?;
    Ok(deb)
}

/// The library dependencies of the module, as `dpkg-shlibdeps` computes
/// them from the distribution's shlibs files (`libc6 (>= 2.34), libssl3 (>= 3.0.0)`).
fn shlib_depends(so: &Path, scratch: &Path) -> Result<String, String> {
    // dpkg-shlibdeps wants to run in a source package's directory.
    let dir = scratch.join("shlibdeps");
    fs::create_dir_all(dir.join("debian")).map_err(|e| format!("mkdir: {e}"))?;
    fs::write(
        dir.join("debian/control"),
        format!("Source: {PACKAGE}\n\nPackage: {PACKAGE}\nArchitecture: any\n"),
    )
    .map_err(|e| format!("debian/control: {e}"))?;
    let out = capture(Command::new("dpkg-shlibdeps").arg("-O").arg(so).current_dir(&dir))?;
    out.lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .map(str::to_string)
        .ok_or_else(|| format!("dpkg-shlibdeps printed no shlibs:Depends: {out}"))
}

fn installed_size_kib(dir: &Path) -> Result<u64, String> {
    let out = capture(Command::new("du").args(["-s", "-k", "--exclude=DEBIAN"]).arg(dir))?;
    out.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("du printed {out:?}"))
}

/// `md5sums` of the control area: every regular file outside `DEBIAN/`.
fn md5sums(staging: &Path) -> Result<String, String> {
    let out = capture(Command::new("bash").current_dir(staging).args([
        "-c",
        "find . -path ./DEBIAN -prune -o -type f -printf '%P\\0' | LC_ALL=C sort -z | xargs -0 md5sum",
    ]))?;
    Ok(out + "\n")
}

/// `NGINX_VERSION` of `src/core/nginx.h`.
fn nginx_version(header: &str) -> Option<String> {
    header.lines().find_map(|l| {
        let rest = l.strip_prefix("#define NGINX_VERSION")?;
        let v = rest.trim().strip_prefix('"')?.strip_suffix('"')?;
        (!v.is_empty() && v.bytes().all(|b| b.is_ascii_digit() || b == b'.')).then(|| v.to_string())
    })
}

/// The `nginx:abi=` line of Debian's substvars, checked to be a plain
/// package name (it goes into `Depends:` verbatim).
fn nginx_abi(substvars: &str) -> Option<String> {
    substvars.lines().find_map(|l| {
        let abi = l.trim().strip_prefix("nginx:abi=")?;
        let plain = abi.starts_with("nginx-abi-")
            && abi
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.+".contains(&b));
        plain.then(|| abi.to_string())
    })
}

/// Our version, a Debian revision, and the ABI the build is for, so that
/// packages for two nginx ABIs never share a version
/// (`0.1.0-1+nginx.1.22.1.7`).
fn package_version(crate_version: &str, abi: &str) -> String {
    let abi = abi.trim_start_matches("nginx-abi-").replace('-', ".");
    format!("{crate_version}-{DEBIAN_REVISION}+nginx.{abi}")
}

struct ControlFields {
    version: String,
    architecture: String,
    depends: String,
    installed_size_kib: u64,
    nginx_version: String,
}

impl ControlFields {
    fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "Package: {PACKAGE}");
        let _ = writeln!(s, "Source: dynamic-balancer");
        let _ = writeln!(s, "Version: {}", self.version);
        let _ = writeln!(s, "Architecture: {}", self.architecture);
        let _ = writeln!(
            s,
            "Maintainer: dynamic-balancer maintainers <dynamic-balancer@localhost>"
        );
        let _ = writeln!(s, "Installed-Size: {}", self.installed_size_kib);
        let _ = writeln!(s, "Depends: {}", self.depends);
        let _ = writeln!(s, "Recommends: nginx");
        let _ = writeln!(s, "Section: httpd");
        let _ = writeln!(s, "Priority: optional");
        let _ = writeln!(s, "Multi-Arch: foreign");
        let _ = writeln!(
            s,
            "Description: API-driven upstreams in shared memory for nginx {}",
            self.nginx_version
        );
        for line in [
            "ngx_http_dynamic_balancer_module keeps upstream backends in nginx shared",
            "memory and serves a JSON /configuration API (ingress-nginx's wire format)",
            "to change them. Endpoint, weight, algorithm and canary changes apply on",
            "the next request with no reload; dynamic_balancer_state keeps them across",
            "restarts. Built for this distribution's nginx ABI only.",
        ] {
            let _ = writeln!(s, " {line}");
        }
        s
    }
}

fn load_snippet() -> String {
    format!("load_module modules/{MODULE_FILE};\n")
}

fn copyright() -> String {
    format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: dynamic-balancer\n\n\
         Files: *\n\
         Copyright: the dynamic-balancer authors\n\
         License: {}\n \
         On Debian systems, the full text of the Apache License 2.0 is in\n \
         /usr/share/common-licenses/Apache-2.0.\n",
        env!("CARGO_PKG_LICENSE")
    )
}

/// postinst, prerm and postrm: enable the module on a fresh install (a
/// link in `modules-enabled`), keep an administrator's removal of that link
/// across upgrades (it is parked as `.removed` on remove and restored only
/// if it was ours), drop it on purge, and ask nginx's reload trigger to run.
fn maintainer_scripts() -> [(&'static str, String); 3] {
    let link = format!("/etc/nginx/modules-enabled/{ENABLED_LINK}");
    let target = format!("/usr/share/nginx/modules-available/{SNIPPET}");
    let postinst = format!(
        "#!/bin/sh\nset -e\n\
         if [ \"$1\" = configure ]; then\n\
         \tif [ -L {link}.removed ]; then\n\
         \t\trm -f {link}.removed\n\
         \t\tln -sf {target} {link}\n\
         \telif [ -z \"$2\" ]; then\n\
         \t\tmkdir -p /etc/nginx/modules-enabled\n\
         \t\tln -sf {target} {link}\n\
         \tfi\n\
         \tif command -v dpkg-trigger >/dev/null 2>&1; then\n\
         \t\tdpkg-trigger --no-await nginx-reload\n\
         \tfi\n\
         fi\n"
    );
    let prerm = format!(
        "#!/bin/sh\nset -e\n\
         if [ \"$1\" = remove ] || [ \"$1\" = deconfigure ]; then\n\
         \tif [ -L {link} ]; then\n\
         \t\tmv {link} {link}.removed\n\
         \tfi\n\
         fi\n"
    );
    let postrm = format!(
        "#!/bin/sh\nset -e\n\
         if [ \"$1\" = purge ]; then\n\
         \trm -f {link} {link}.removed\n\
         fi\n\
         if [ \"$1\" = remove ] && command -v dpkg-trigger >/dev/null 2>&1; then\n\
         \tdpkg-trigger --no-await nginx-reload\n\
         fi\n"
    );
    [("postinst", postinst), ("prerm", prerm), ("postrm", postrm)]
}

fn write(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    set_mode(path, mode)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(|e| format!("chmod {}: {e}", path.display()))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("{cmd:?} failed ({status})"))
}

fn capture(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_version_and_abi_of_debian_files() {
        let header = "#define nginx_version      1022001\n#define NGINX_VERSION      \"1.22.1\"\n";
        assert_eq!(nginx_version(header).as_deref(), Some("1.22.1"));
        assert_eq!(nginx_version("#define NGINX_VERSION \"1.2$(x)\""), None);
        let substvars = "# comment\nnginx:abi=nginx-abi-1.22.1-7\n\nlibnginx-mod-http-echo:Version=1:0.63-4\n";
        assert_eq!(nginx_abi(substvars).as_deref(), Some("nginx-abi-1.22.1-7"));
        assert_eq!(nginx_abi("nginx:abi=nginx-abi-1, evil\n"), None);
        assert_eq!(nginx_abi("nginx:abi=libc6\n"), None);
    }

    #[test]
    fn versions_name_the_abi() {
        assert_eq!(package_version("0.1.0", "nginx-abi-1.22.1-7"), "0.1.0-1+nginx.1.22.1.7");
        assert_eq!(package_version("0.1.0", "nginx-abi-1.26.3-3"), "0.1.0-1+nginx.1.26.3.3");
    }

    #[test]
    fn control_file_has_debian_fields() {
        let c = ControlFields {
            version: "0.1.0-1+nginx.1.22.1.7".into(),
            architecture: "amd64".into(),
            depends: "nginx-abi-1.22.1-7, libc6 (>= 2.34)".into(),
            installed_size_kib: 1234,
            nginx_version: "1.22.1".into(),
        }
        .render();
        assert!(c.starts_with("Package: libnginx-mod-http-dynamic-balancer\n"));
        assert!(c.contains("\nDepends: nginx-abi-1.22.1-7, libc6 (>= 2.34)\n"));
        // Every continuation line of the description starts with a space.
        let description = c.split_once("Description:").unwrap().1;
        assert!(description.lines().skip(1).all(|l| l.starts_with(' ')));
        assert!(c.ends_with('\n'));
    }

    #[test]
    fn scripts_manage_one_link() {
        for (name, text) in maintainer_scripts() {
            assert!(text.starts_with("#!/bin/sh\nset -e\n"), "{name}");
            assert!(
                text.contains("/etc/nginx/modules-enabled/50-mod-http-dynamic-balancer.conf"),
                "{name}"
            );
        }
        assert_eq!(
            load_snippet(),
            "load_module modules/ngx_http_dynamic_balancer_module.so;\n"
        );
    }
}
