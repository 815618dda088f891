//! The last check before nginx reads a configuration: every file it names
//! is one the controller meant it to.
//!
//! Values are typed and snippets judged long before this point, so this
//! is defence in depth: if a value ever slipped through (a bug, a replaced
//! `--template`, a ConfigMap log path), nginx must still not load a library,
//! include a file or read a key from anywhere but the controller's own
//! directories. Each rendered configuration is parsed with nginx's rules
//! ([`crate::conf_syntax`]) before `nginx -t`, and every file a directive
//! names is checked against [`FileRoots`]:
//! - code (`load_module`): exactly the module the controller was given;
//! - `include`: the controller's directory only;
//! - files read: the controller's directory, the default certificate, the
//!   operator's `--snippet-allowed-path`s;
//! - files written: the same, the log and pid files given by flags, and
//!   `/var/log`;
//! - never a variable, a `..`, or a path under `/proc`, `/sys`, `/dev` (but
//!   logs to the standard streams) or the Pod's credentials, and a file
//!   that exists is judged by where its symbolic links lead.
//!
//! A refusal reads like nginx's own messages (`... in <file>:<line>`), so
//! the quarantine search pins it on the Ingress whose lines it names.

use std::path::{Path, PathBuf};

use crate::conf_syntax::files::{self, Access};
use crate::conf_syntax::parse::{self, Limits};
use crate::conf_syntax::Directive;

/// Where the files a rendered configuration names may be, by access.
#[derive(Debug, Clone, Default)]
pub struct FileRoots {
    /// nginx's prefix (`-p`): relative names resolve against it.
    pub prefix: PathBuf,
    /// Files loaded as code: each exactly.
    pub code: Vec<PathBuf>,
    /// Where `include` may read.
    pub config: Vec<PathBuf>,
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
}

impl FileRoots {
    /// The roots for a controller whose directory (and nginx prefix) is
    /// `conf_dir`, loading `module`; `read` and `write` get `extra` too.
    pub fn new(conf_dir: &Path, module: &Path, extra_read: &[PathBuf], extra_write: &[PathBuf]) -> FileRoots {
        let mut read = vec![conf_dir.to_path_buf()];
        read.extend(extra_read.iter().cloned());
        let mut write = vec![conf_dir.to_path_buf(), PathBuf::from("/var/log")];
        write.extend(extra_write.iter().cloned());
        FileRoots {
            prefix: conf_dir.to_path_buf(),
            code: vec![module.to_path_buf()],
            config: vec![conf_dir.to_path_buf()],
            read,
            write,
        }
    }

    fn roots(&self, access: Access) -> &[PathBuf] {
        match access {
            Access::Code => &self.code,
            Access::Config => &self.config,
            Access::Read => &self.read,
            Access::Write => &self.write,
        }
    }
}

/// Why a configuration may not be given to nginx.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub line: usize,
    pub message: String,
}

/// Checks every file `text` names; `file` is only for the message.
pub fn check(text: &str, file: &Path, roots: &FileRoots) -> Result<(), Refusal> {
    let at = |line: usize, message: String| Refusal {
        line,
        message: format!("{message} in {}:{line}", file.display()),
    };
    let tree = parse::parse(text, Limits::default()).map_err(|e| at(e.line, e.message))?;
    let mut refusal = None;
    Directive::walk(&tree, &mut |d, outer| {
        if refusal.is_some() || outer.last() == Some(&"types") {
            return;
        }
        if d.name() == "ssl_engine" {
            refusal = Some(at(d.line, "ssl_engine is never rendered: it loads code".into()));
            return;
        }
        for f in files::file_args(d) {
            if let Err(e) = check_one(f.path, f.access, roots) {
                refusal = Some(at(d.line, format!("{}: {e}", d.name())));
                return;
            }
        }
    });
    refusal.map_or(Ok(()), Err)
}

fn check_one(path: &str, access: Access, roots: &FileRoots) -> Result<(), String> {
    let allowed = roots.roots(access);
    let normal = files::check_path(path, access, &roots.prefix, allowed)?;
    if access == Access::Write {
        return Ok(());
    }
    // A file that exists is judged by where it really is: a link in an
    // allowed directory must not lead out of it.
    let Ok(real) = std::fs::canonicalize(&normal) else {
        return Ok(());
    };
    let real_roots: Vec<PathBuf> = allowed
        .iter()
        .map(|r| std::fs::canonicalize(r).unwrap_or_else(|_| r.clone()))
        .collect();
    let shown = real.display().to_string();
    files::check_path(&shown, access, Path::new("/"), &real_roots)
        .map(|_| ())
        .map_err(|e| format!("{path:?} leads to {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots(dir: &Path) -> FileRoots {
        FileRoots::new(dir, &dir.join("modules/m.so"), &[], &[])
    }

    #[test]
    fn the_controllers_files_pass_and_others_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let r = roots(d);
        let file = Path::new("nginx.conf.candidate");
        let good = format!(
            "load_module {m};\nerror_log logs/error.log notice;\npid {d}/logs/nginx.pid;\nevents {{}}\n\
             http {{\n    access_log /dev/stdout;\n    proxy_cache_path auth-cache keys_zone=a:1m;\n    \
             server {{ ssl_certificate {d}/ssl/default.pem; location / {{ auth_basic_user_file auth/x; }} }}\n}}\n",
            m = d.join("modules/m.so").display(),
            d = d.display()
        );
        check(&good, file, &r).unwrap();
        for (bad, line, why) in [
            ("load_module /tmp/evil.so;", 1, "outside"),
            ("ssl_engine /tmp/evil.so;", 1, "never rendered"),
            ("events {}\ninclude /etc/passwd;", 2, "outside"),
            (
                "http {\n  server {\n    ssl_certificate /proc/self/fd/7;\n  }\n}",
                3,
                "/proc",
            ),
            ("http { root /var/run/secrets/kubernetes.io; }", 1, "/var/run/secrets"),
            ("error_log /etc/cron.d/x;", 1, "outside"),
            ("http { access_log /var/log/$host.log; }", 1, "variable"),
            ("http {\n}\n}", 3, "unexpected"),
        ] {
            let e = check(bad, file, &r).unwrap_err();
            assert_eq!(e.line, line, "{bad}: {e:?}");
            assert!(e.message.contains(why), "{bad}: {e:?}");
            assert!(e.message.ends_with(&format!("in nginx.conf.candidate:{line}")), "{e:?}");
        }
    }

    #[test]
    fn links_are_judged_by_their_target() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("ssl")).unwrap();
        std::os::unix::fs::symlink("/proc/self/environ", d.join("ssl/cert.pem")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", d.join("ssl/other.pem")).unwrap();
        let r = roots(d);
        let file = Path::new("x");
        let e = check(&format!("ssl_certificate {}/ssl/cert.pem;", d.display()), file, &r).unwrap_err();
        assert!(e.message.contains("leads to") && e.message.contains("/proc"), "{e:?}");
        let e = check(&format!("ssl_certificate {}/ssl/other.pem;", d.display()), file, &r).unwrap_err();
        assert!(e.message.contains("leads to"), "{e:?}");
        // Logs to the standard streams are links into /proc too, and fine.
        check("error_log /dev/stderr;", file, &r).unwrap();
    }
}
