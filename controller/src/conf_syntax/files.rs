//! Which directives name files, and where such a file may be.
//!
//! nginx reads, writes or loads a file wherever a directive names one. A
//! configuration that names `/proc/<pid>/fd/<n>` (the body of a request
//! nginx buffered, as CVE-2025-1974 used), the ServiceAccount token or a
//! library of someone else's choice turns the configuration into a way to
//! read secrets or run code. [`file_args`] lists, for the directives of the
//! modules nginx ships (and the usual third-party ones), which arguments
//! are file names; [`check_path`] says whether one may be used. The snippet
//! policy and the check of every rendered configuration both rely on it.

use std::path::{Component, Path, PathBuf};

use super::Directive;

/// What nginx does with a file a directive names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Loads it as code (`load_module`, `ssl_engine`, Perl, njs, Lua).
    Code,
    /// Reads it as configuration (`include`).
    Config,
    /// Reads it (certificates, keys, password files, a `root`).
    Read,
    /// Writes or creates it (logs, temporary and cache directories).
    Write,
}

/// One argument of a directive that names a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileArg<'a> {
    pub path: &'a str,
    pub access: Access,
}

/// Directives whose first argument names a file (or, for a few, a value
/// that is not a file: see [`not_a_file`]).
const FIRST_ARGUMENT: &[(&str, Access)] = &[
    ("load_module", Access::Code),
    ("ssl_engine", Access::Code),
    ("perl_modules", Access::Code),
    ("perl_require", Access::Code),
    ("js_path", Access::Code),
    ("js_import", Access::Code),
    ("js_include", Access::Code),
    ("lua_package_path", Access::Code),
    ("lua_package_cpath", Access::Code),
    ("include", Access::Config),
    ("modsecurity_rules_file", Access::Config),
    ("auth_basic_user_file", Access::Read),
    ("root", Access::Read),
    ("alias", Access::Read),
    ("xslt_stylesheet", Access::Read),
    ("xml_entities", Access::Read),
    ("geoip_country", Access::Read),
    ("geoip_city", Access::Read),
    ("geoip_org", Access::Read),
    ("geoip2", Access::Read),
    ("ssl_certificate", Access::Read),
    ("ssl_certificate_key", Access::Read),
    ("ssl_trusted_certificate", Access::Read),
    ("ssl_client_certificate", Access::Read),
    ("ssl_crl", Access::Read),
    ("ssl_dhparam", Access::Read),
    ("ssl_password_file", Access::Read),
    ("ssl_session_ticket_key", Access::Read),
    ("ssl_stapling_file", Access::Read),
    ("proxy_ssl_certificate", Access::Read),
    ("proxy_ssl_certificate_key", Access::Read),
    ("proxy_ssl_trusted_certificate", Access::Read),
    ("proxy_ssl_crl", Access::Read),
    ("proxy_ssl_password_file", Access::Read),
    ("grpc_ssl_certificate", Access::Read),
    ("grpc_ssl_certificate_key", Access::Read),
    ("grpc_ssl_trusted_certificate", Access::Read),
    ("grpc_ssl_crl", Access::Read),
    ("grpc_ssl_password_file", Access::Read),
    ("uwsgi_ssl_certificate", Access::Read),
    ("uwsgi_ssl_certificate_key", Access::Read),
    ("uwsgi_ssl_trusted_certificate", Access::Read),
    ("uwsgi_ssl_crl", Access::Read),
    ("uwsgi_ssl_password_file", Access::Read),
    ("error_log", Access::Write),
    ("access_log", Access::Write),
    ("pid", Access::Write),
    ("lock_file", Access::Write),
    ("working_directory", Access::Write),
    ("google_perftools_profiles", Access::Write),
    ("client_body_temp_path", Access::Write),
    ("proxy_temp_path", Access::Write),
    ("fastcgi_temp_path", Access::Write),
    ("uwsgi_temp_path", Access::Write),
    ("scgi_temp_path", Access::Write),
    ("proxy_cache_path", Access::Write),
    ("fastcgi_cache_path", Access::Write),
    ("uwsgi_cache_path", Access::Write),
    ("scgi_cache_path", Access::Write),
    ("proxy_store", Access::Write),
    ("fastcgi_store", Access::Write),
    ("uwsgi_store", Access::Write),
    ("scgi_store", Access::Write),
    ("ssl_key_log", Access::Write),
    ("proxy_ssl_key_log", Access::Write),
    ("grpc_ssl_key_log", Access::Write),
    ("uwsgi_ssl_key_log", Access::Write),
];

/// Values in a file position that are not file names: switches, nginx's
/// pseudo-destinations, and certificates given inline (`data:`).
fn not_a_file(name: &str, value: &str) -> bool {
    match name {
        "error_log" | "access_log" => {
            value == "off" || value == "stderr" || value.starts_with("syslog:") || value.starts_with("memory:")
        }
        "proxy_store" | "fastcgi_store" | "uwsgi_store" | "scgi_store" => value == "on" || value == "off",
        "ssl_certificate"
        | "ssl_certificate_key"
        | "proxy_ssl_certificate"
        | "proxy_ssl_certificate_key"
        | "grpc_ssl_certificate"
        | "grpc_ssl_certificate_key"
        | "uwsgi_ssl_certificate"
        | "uwsgi_ssl_certificate_key" => value.starts_with("data:"),
        _ => false,
    }
}

/// The arguments of `d` that name files.
pub fn file_args(d: &Directive) -> Vec<FileArg<'_>> {
    let name = d.name();
    let Some(&(_, access)) = FIRST_ARGUMENT.iter().find(|(n, _)| *n == name) else {
        return Vec::new();
    };
    match d.args.get(1) {
        Some(v) if !not_a_file(name, v) => vec![FileArg { path: v, access }],
        _ => Vec::new(),
    }
}

/// Directories no configuration may name, whatever is allowed: the
/// kernel's views of processes (`/proc/<pid>/fd/<n>` reaches the files a
/// process holds, deleted request bodies included), devices, and the
/// Pod's mounted credentials.
const NEVER: &[&str] = &["/proc", "/sys", "/dev", "/run/secrets", "/var/run/secrets"];

/// Devices a log may still be written to.
const LOG_DEVICES: &[&str] = &["/dev/stdout", "/dev/stderr", "/dev/null"];

/// Whether `path` (absolute, or relative to nginx's `prefix`) may be used
/// for `access`: it names no variable, has no `..`, is outside [`NEVER`]
/// (but for logs on the standard streams), and lies inside one of `roots`.
/// Returns the absolute, lexically normal path. The file system is not
/// consulted: symbolic links are the caller's to resolve.
pub fn check_path(path: &str, access: Access, prefix: &Path, roots: &[PathBuf]) -> Result<PathBuf, String> {
    if path.contains('$') {
        return Err(format!(
            "{path:?} names a variable: the file would be chosen per request"
        ));
    }
    if path.is_empty() || path.contains('\0') {
        return Err(format!("{path:?} is not a file name"));
    }
    let joined = if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        prefix.join(path)
    };
    let mut normal = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => normal.push(part),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(format!("{path:?} climbs out of its directory (\"..\")"));
            }
        }
    }
    if access == Access::Write && LOG_DEVICES.iter().any(|d| normal == Path::new(d)) {
        return Ok(normal);
    }
    if let Some(never) = NEVER.iter().find(|n| normal.starts_with(n)) {
        return Err(format!("{path:?} is under {never}, which no configuration may name"));
    }
    if roots.iter().any(|r| normal.starts_with(r)) {
        Ok(normal)
    } else {
        Err(format!("{path:?} is outside the directories allowed for it"))
    }
}

/// Whether `root` may be offered to configurations as a place for files:
/// absolute, lexically normal, not `/` and not inside (or around) a
/// directory of [`NEVER`].
pub fn valid_root(root: &Path) -> Result<(), String> {
    let shown = root.display();
    if !root.is_absolute()
        || root
            .components()
            .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return Err(format!("{shown} is not an absolute path without \"..\" or \".\""));
    }
    if root == Path::new("/") {
        return Err("/ would allow every file".into());
    }
    if let Some(n) = NEVER
        .iter()
        .find(|n| root.starts_with(n) || Path::new(n).starts_with(root))
    {
        return Err(format!("{shown} overlaps {n}, which no configuration may name"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(args: &[&str]) -> Directive {
        Directive {
            args: args.iter().map(|s| s.to_string()).collect(),
            line: 1,
            block: None,
        }
    }

    #[test]
    fn file_arguments_are_found_and_pseudo_files_skipped() {
        assert_eq!(
            file_args(&d(&["ssl_engine", "/tmp/x.so"])),
            vec![FileArg {
                path: "/tmp/x.so",
                access: Access::Code
            }]
        );
        assert_eq!(file_args(&d(&["access_log", "off"])), vec![]);
        assert_eq!(file_args(&d(&["error_log", "syslog:server=1.2.3.4"])), vec![]);
        assert_eq!(file_args(&d(&["ssl_certificate", "data:$cert"])), vec![]);
        assert_eq!(file_args(&d(&["proxy_store", "on"])), vec![]);
        assert_eq!(file_args(&d(&["add_header", "/etc/passwd"])), vec![]);
        assert_eq!(file_args(&d(&["root"])), vec![]);
    }

    #[test]
    fn paths_outside_the_roots_are_refused() {
        let prefix = Path::new("/etc/ingress-controller");
        let roots = vec![PathBuf::from("/etc/ingress-controller"), PathBuf::from("/srv/static")];
        let ok = |p: &str, a| check_path(p, a, prefix, &roots);
        assert_eq!(
            ok("logs/error.log", Access::Write).unwrap(),
            Path::new("/etc/ingress-controller/logs/error.log")
        );
        assert!(ok("/srv/static/site", Access::Read).is_ok());
        assert!(ok("/dev/stderr", Access::Write).is_ok());
        for (bad, why) in [
            ("/proc/self/fd/3", "under /proc"),
            ("/proc/1/root/etc/shadow", "under /proc"),
            ("/dev/fd/7", "under /dev"),
            (
                "/var/run/secrets/kubernetes.io/serviceaccount/token",
                "under /var/run/secrets",
            ),
            ("/srv/static/../../etc/passwd", "climbs"),
            ("../../etc/passwd", "climbs"),
            ("/srv/static/$http_x", "variable"),
            ("/srv/staticx/a", "outside"),
            ("/tmp/evil.so", "outside"),
        ] {
            let e = ok(bad, Access::Read).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(ok("/dev/stderr", Access::Read).is_err());
    }

    #[test]
    fn roots_must_be_narrow() {
        assert!(valid_root(Path::new("/srv/static")).is_ok());
        for bad in [
            "/",
            "relative",
            "/srv/../etc",
            "/proc",
            "/proc/1",
            "/var/run",
            "/dev/shm",
        ] {
            assert!(valid_root(Path::new(bad)).is_err(), "{bad}");
        }
    }
}
