//! Another Debian suite's nginx, in a chroot made with debootstrap.
//!
//! A newer suite's nginx cannot be installed next to this system's: trixie's
//! needs `libssl3t64`, which needs glibc 2.38, and bookworm has 2.36. So the
//! package for it is built and tested where that nginx runs: a minimal
//! chroot of the suite, kept outside the clone
//! (`/var/cache/dynamic-balancer/<suite>-root`, made once per machine), with
//! the workspace, the Rust toolchain, `/tmp` and the host's `/etc/hosts`
//! and `/etc/resolv.conf` bind-mounted at the same paths in a private mount
//! namespace. Inside it `nginx-build deb` runs as on
//! the host, against the suite's `nginx-dev`, and `dpkg-shlibdeps` names the
//! suite's libraries. The test harness runs the suite's nginx through a
//! wrapper that enters the chroot with `exec` all the way down, so the PID
//! the harness holds is the nginx master's.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::build::{install_packages, workspace_root};

const CACHE: &str = "/var/cache/dynamic-balancer";
const MIRROR: &str = "http://deb.debian.org/debian";
/// What the chroot needs on top of what `nginx-build deb` installs there
/// itself: the suite's nginx (the tests run it), a compiler and its C
/// library for the build scripts, and the CA certificates apt and cargo use.
const CHROOT_EXTRA_PACKAGES: &[&str] = &["nginx", "gcc", "libc6-dev", "ca-certificates"];

pub struct Chroot {
    pub suite: String,
    pub root: PathBuf,
}

impl Chroot {
    /// The chroot of `suite`, made (debootstrap) and provisioned (apt) if
    /// this machine has not done it yet.
    pub fn ensure(suite: &str) -> Result<Chroot, String> {
        if suite.is_empty() || !suite.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
            return Err(format!("{suite:?} is not a Debian suite name"));
        }
        let chroot = Chroot {
            suite: suite.to_string(),
            root: Path::new(CACHE).join(format!("{suite}-root")),
        };
        if !chroot.root.join("etc/debian_version").exists() {
            install_packages(&["debootstrap"])?;
            eprintln!("nginx-build: debootstrap {suite} into {}", chroot.root.display());
            let partial = chroot.root.with_extension("partial");
            let _ = std::fs::remove_dir_all(&partial);
            std::fs::create_dir_all(CACHE).map_err(|e| format!("mkdir {CACHE}: {e}"))?;
            run(Command::new("debootstrap")
                .args(["--variant=minbase", suite])
                .arg(&partial)
                .arg(MIRROR))?;
            std::fs::rename(&partial, &chroot.root).map_err(|e| format!("rename {}: {e}", partial.display()))?;
        }
        let stamp = chroot.root.join("var/lib/dynamic-balancer-packages");
        let wanted = crate::build::deb_packages()
            .into_iter()
            .chain(CHROOT_EXTRA_PACKAGES.iter().copied())
            .collect::<Vec<_>>()
            .join(" ");
        if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
            eprintln!("nginx-build: installing {suite}'s nginx and build tools in the chroot");
            chroot.run_shell(&format!(
                "apt-get update -qq && apt-get install -y -qq --no-install-recommends {wanted}"
            ))?;
            std::fs::write(&stamp, &wanted).map_err(|e| format!("{}: {e}", stamp.display()))?;
        }
        Ok(chroot)
    }

    /// The mounts and the `chroot` that put a command inside, as a shell
    /// prefix: everything that must look the same inside is bind-mounted at
    /// its own path, in a mount namespace of the command's own, so nothing
    /// stays mounted after it.
    fn enter(&self) -> String {
        let root = self.root.display();
        let mut binds = vec!["/proc".to_string(), "/dev".to_string(), "/tmp".to_string()];
        binds.push(workspace_root().display().to_string());
        for var in ["CARGO_HOME", "RUSTUP_HOME"] {
            if let Some(dir) = std::env::var_os(var) {
                binds.push(PathBuf::from(dir).display().to_string());
            }
        }
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        binds.push(format!("{home}/.cargo"));
        binds.push(format!("{home}/.rustup"));
        binds.sort();
        binds.dedup();
        let mut s = String::new();
        for dir in binds.iter().filter(|d| Path::new(d).exists()) {
            s.push_str(&format!("mkdir -p {root}{dir} && mount --bind {dir} {root}{dir} && "));
        }
        // The host's names, so that the suite's nginx resolves a name to
        // what the tests (on the host) resolve it to.
        for file in ["/etc/hosts", "/etc/resolv.conf"]
            .iter()
            .filter(|f| Path::new(f).exists())
        {
            s.push_str(&format!("touch {root}{file} && mount --bind {file} {root}{file} && "));
        }
        let path = format!("{home}/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        s.push_str(&format!(
            "exec chroot {root} env HOME={home} PATH={path} DEBIAN_FRONTEND=noninteractive"
        ));
        s
    }

    /// Runs `script` with sh inside the chroot.
    pub fn run_shell(&self, script: &str) -> Result<(), String> {
        run(Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!("{} sh -c '{}'", self.enter(), script.replace('\'', "'\\''"))))
    }

    /// Runs `program args...` inside the chroot, returning its stdout.
    pub fn capture(&self, program: &Path, args: &[&str]) -> Result<String, String> {
        let out = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!("{} \"$0\" \"$@\"", self.enter()))
            .arg(program)
            .args(args)
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot run unshare: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{} in the {} chroot failed ({})",
                program.display(),
                self.suite,
                out.status
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A script that runs the suite's nginx with its arguments inside the
    /// chroot, replacing itself at every step (unshare, sh, chroot, env), so
    /// that its PID is nginx's.
    pub fn nginx_wrapper(&self) -> String {
        format!(
            "#!/bin/sh\n# The {suite} chroot's nginx (nginx-build deb-install --suite {suite}).\n\
             exec unshare --mount --propagation private sh -c '{enter} /usr/sbin/nginx \"$@\"' nginx \"$@\"\n",
            suite = self.suite,
            enter = self.enter()
        )
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("{cmd:?} failed ({status})"))
}
