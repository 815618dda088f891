//! Snippets (`configuration-snippet`, `server-snippet`): raw nginx syntax
//! from an Ingress, allowed only with `--allow-snippet-annotations`, and
//! even then kept inside its block and away from code and files.
//!
//! ingress-nginx renders snippets verbatim, so a snippet that closes its
//! blocks (`} } } ssl_engine /x.so; http { ...`) writes nginx's main
//! context, and CVE-2025-1974 turned that into code execution. Here a
//! snippet is parsed as nginx would parse it ([`crate::conf_syntax`]):
//! - its braces must balance within the snippet, and nothing may be left
//!   open (a quote, an escape, a statement without `;`);
//! - directives that load code, read configuration, change the process or
//!   reach the controller's own machinery are refused wherever they appear
//!   ([`refusal`]);
//! - a directive that reads or writes a file may name one only inside a
//!   directory the operator allowed (`--snippet-allowed-path`), literally,
//!   never under `/proc`, `/sys`, `/dev` or the Pod's credentials;
//! - a `*_pass` may not reach the local host, a Unix socket or the
//!   controller's balancer upstreams, and `set` may not overwrite the
//!   variables the controller routes and labels by.
//!
//! What is rendered is not the author's text but the parsed directives
//! written back in canonical form ([`crate::conf_syntax::emit`]), so the
//! structure nginx reads is the one judged here. Comments are dropped.

use std::path::PathBuf;

use serde::{Serialize, Serializer};

use super::values::Invalid;
use crate::conf_syntax::files::{self, Access};
use crate::conf_syntax::parse::{self, Limits};
use crate::conf_syntax::{emit, Directive};

/// Largest snippet accepted, in bytes (Kubernetes allows 256 KiB of
/// annotations in all).
pub const MAX_BYTES: usize = 64 * 1024;

/// Blocks inside a snippet, at most (`location` in `location` in `if`...).
const MAX_DEPTH: usize = 8;

/// Bytes of one word as rendered, at most (nginx's limit is 4096).
const MAX_WORD: usize = 4000;

/// Directives in one snippet, at most.
const MAX_DIRECTIVES: usize = 2000;

/// What the operator allows snippets to do beyond the defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Directories whose files snippets may name (`root`, `alias`,
    /// certificates, password files, logs); validated by
    /// [`files::valid_root`]. Empty by default: no snippet names a file.
    pub allowed_paths: Vec<PathBuf>,
}

impl Policy {
    /// The policy with `paths` allowed, each checked to be narrow enough.
    pub fn new(paths: Vec<PathBuf>) -> Result<Policy, String> {
        for p in &paths {
            files::valid_root(p).map_err(|e| format!("--snippet-allowed-path: {e}"))?;
        }
        Ok(Policy { allowed_paths: paths })
    }
}

/// A snippet that passed [`Snippet::parse`]: its directives in canonical
/// text (no indentation on the first line, four spaces per block after).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Snippet(String);

impl Serialize for Snippet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl Snippet {
    /// Parses and judges `text` (for a `server {}` or a `location {}`: the
    /// rules are the same); `Ok(None)` when it holds no directive (empty,
    /// blank, comments only).
    pub fn parse(text: &str, policy: &Policy) -> Result<Option<Snippet>, Invalid> {
        if text.len() > MAX_BYTES {
            return Err(Invalid(format!(
                "the snippet is {} bytes; at most {MAX_BYTES} are accepted",
                text.len()
            )));
        }
        let tree = parse::parse(text, Limits { max_depth: MAX_DEPTH }).map_err(|e| {
            Invalid(format!(
                "the snippet is not a complete list of nginx directives: {e}{}",
                if e.message.contains('}') || e.message.contains("end of file") {
                    "; a snippet must close every block it opens and no other"
                } else {
                    ""
                }
            ))
        })?;
        let mut problems = Vec::new();
        let mut count = 0usize;
        Directive::walk(&tree, &mut |d, outer| {
            count += 1;
            if let Err(why) = judge(d, outer, policy) {
                problems.push(format!("line {}: {}: {why}", d.line, shorten(d.name())));
            }
        });
        if count > MAX_DIRECTIVES {
            return Err(Invalid(format!(
                "the snippet has {count} directives; at most {MAX_DIRECTIVES} are accepted"
            )));
        }
        if !problems.is_empty() {
            problems.truncate(5);
            return Err(Invalid(format!("refused in a snippet: {}", problems.join("; "))));
        }
        if tree.is_empty() {
            return Ok(None);
        }
        Ok(Some(Snippet(emit::directives(&tree, 0))))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A name or value quoted in a message, cut short.
fn shorten(s: &str) -> String {
    let cut: String = s.chars().take(64).collect();
    if cut.len() < s.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

/// Why one directive may not be in a snippet, if it may not.
fn judge(d: &Directive, outer: &[&str], policy: &Policy) -> Result<(), String> {
    for a in &d.args {
        if let Some(c) = a.chars().find(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r')) {
            return Err(format!("a control character ({:?}) in {}", c, shorten(a)));
        }
        // nginx reads at most 4096 bytes of one word, escapes included;
        // 4000 leaves room for how its buffer happens to be filled.
        if emit::word(a).len() > MAX_WORD {
            return Err(format!("a word of {} bytes is too long for nginx", a.len()));
        }
    }
    let name = d.name().to_ascii_lowercase();
    if let Some(why) = refusal(&name) {
        return Err(why.into());
    }
    // Inside `types {}` (the only block with entries of its own a location
    // may hold) the first word is a MIME type, not a directive.
    if outer.last() == Some(&"types") {
        return Ok(());
    }
    for f in files::file_args(d) {
        if f.access == Access::Code || f.access == Access::Config {
            return Err("it loads code or configuration from a file".into());
        }
        // Relative names resolve against nginx's prefix, the controller's
        // own directory: never allowed.
        files::check_path(
            f.path,
            f.access,
            &PathBuf::from("/nonexistent-prefix"),
            &policy.allowed_paths,
        )
        .map_err(|e| {
            if policy.allowed_paths.is_empty() {
                format!("{e}; snippets may name files only under --snippet-allowed-path, which is not set")
            } else {
                e
            }
        })?;
    }
    if name.ends_with("_pass") {
        pass_target(&d.args)?;
    }
    if matches!(
        name.as_str(),
        "set" | "auth_request_set" | "set_by_lua" | "js_set" | "perl_set"
    ) {
        if let Some(var) = d.args.get(1) {
            let v = var.trim_start_matches('$').to_ascii_lowercase();
            if RESERVED_VARIABLES.contains(&v.as_str()) || v.starts_with("dynamic_") {
                return Err(format!("${v} is the controller's: it routes or labels requests by it"));
            }
        }
    }
    Ok(())
}

/// Variables the rendered configuration sets and the module or the logs
/// read: overwriting one would route a request to another backend (the
/// balancer reads `$proxy_upstream_name` where no literal names one) or
/// attribute it to another Ingress.
const RESERVED_VARIABLES: &[&str] = &[
    "proxy_upstream_name",
    "proxy_alternative_upstream_name",
    "namespace",
    "ingress_name",
    "service_name",
    "service_port",
    "location_path",
    "auth_target",
    "mirror_target",
    "best_http_host",
    "pass_access_scheme",
    "pass_server_port",
    "pass_port",
    "req_id",
];

/// Why a directive name is refused anywhere in a snippet.
pub fn refusal(name: &str) -> Option<&'static str> {
    const CODE: &str = "it loads code into nginx";
    const PROCESS: &str = "it changes the nginx process, not a server or location";
    const CONTROLLER: &str = "the module's directives are the controller's to render";
    const WRITES: &str = "it writes files or creates directories";
    let exact = match name {
        "load_module" | "ssl_engine" | "perl" | "perl_modules" | "perl_require" | "perl_set" => Some(CODE),
        "include" => Some("it reads configuration from a file"),
        "env"
        | "user"
        | "pid"
        | "lock_file"
        | "working_directory"
        | "daemon"
        | "master_process"
        | "worker_processes"
        | "worker_priority"
        | "worker_cpu_affinity"
        | "worker_rlimit_core"
        | "worker_rlimit_nofile"
        | "worker_shutdown_timeout"
        | "worker_connections"
        | "thread_pool"
        | "timer_resolution"
        | "pcre_jit"
        | "debug_points"
        | "debug_connection"
        | "google_perftools_profiles"
        | "ssl_object_cache_inheritable"
        | "quic_bpf"
        | "events"
        | "http"
        | "stream"
        | "mail"
        | "upstream" => Some(PROCESS),
        "ssl_conf_command" | "proxy_ssl_conf_command" | "grpc_ssl_conf_command" | "uwsgi_ssl_conf_command" => {
            Some("OpenSSL configuration commands can load files and engines")
        }
        "proxy_store" | "fastcgi_store" | "uwsgi_store" | "scgi_store" | "dav_methods" | "create_full_put_path" => {
            Some(WRITES)
        }
        "modsecurity_rules_file" | "modsecurity_rules_remote" => Some("it loads rules from a file or the network"),
        "listen" | "server_name" => Some("listeners and host names are the controller's to render (use the Ingress)"),
        _ => None,
    };
    if exact.is_some() {
        return exact;
    }
    if name.starts_with("lua_")
        || name.contains("_by_lua")
        || name.starts_with("js_")
        || name.starts_with("njs")
        || name.starts_with("perl")
    {
        return Some(CODE);
    }
    if name.starts_with("dynamic_balancer") {
        return Some(CONTROLLER);
    }
    if name.ends_with("_temp_path") || name.ends_with("_cache_path") {
        return Some(WRITES);
    }
    None
}

/// Why the target of a `*_pass` may not be used: a Unix socket, the local
/// host, a target chosen per request, or the controller's balancer (which
/// serves every tenant's backends).
fn pass_target(args: &[String]) -> Result<(), String> {
    let Some(target) = args.get(1) else {
        return Ok(());
    };
    let lower = target.to_ascii_lowercase();
    let rest = lower.split_once("://").map_or(lower.as_str(), |(_, r)| r);
    if rest.starts_with("unix:") {
        return Err("it names a Unix socket".into());
    }
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    if authority.contains('$') {
        return Err("its host is chosen per request (a variable)".into());
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    if host.starts_with("upstream_balancer") || host == "tcp_udp_balancer" {
        return Err("the balancer upstream serves every tenant's backends; use an Ingress path".into());
    }
    if let Some(why) = lua_compat::address::forbidden_external_name(host) {
        return Err(format!("it reaches {why}"));
    }
    if lua_compat::address::is_numeric_address(host) {
        return Err("its host is an address written as a number".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location(text: &str) -> Result<Option<Snippet>, Invalid> {
        Snippet::parse(text, &Policy::default())
    }

    fn refused(text: &str) -> String {
        location(text).unwrap_err().0
    }

    #[test]
    fn ordinary_snippets_are_kept_in_canonical_form() {
        let s = location("add_header X-Frame-Options DENY;  # keep\nif ($http_x = \"a b\") { return 403; }\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            s.as_str(),
            "add_header X-Frame-Options DENY;\nif ($http_x = \"a b\" ) {\n    return 403;\n}"
        );
        assert_eq!(location("  # only a comment\n").unwrap(), None);
        assert_eq!(location("").unwrap(), None);
        let server = Snippet::parse(
            "location /health { access_log off; return 200 ok; }",
            &Policy::default(),
        )
        .unwrap()
        .unwrap();
        assert!(server.as_str().starts_with("location /health {"));
    }

    #[test]
    fn breakouts_are_refused() {
        for text in [
            "} } } ssl_engine /x.so; http { server { location /zz {",
            "}",
            "return 200; }\nserver { listen 81; }\nserver {",
            "add_header a b; # }\n}",
            "add_header a \"b;\n",
            "add_header a b",
            "add_header a b\\",
            "location /a {",
            "add_header a 'b}';}",
        ] {
            let e = refused(text);
            assert!(e.contains("not a complete list"), "{text:?}: {e}");
        }
    }

    #[test]
    fn hidden_braces_stay_words() {
        // Braces inside quotes, comments and words are not structure; the
        // canonical form quotes them, so nginx reads them as words too.
        let s = location("add_header X \"} } } ssl_engine /x.so; http {\";")
            .unwrap()
            .unwrap();
        assert_eq!(s.as_str(), "add_header X \"} } } ssl_engine /x.so; http {\";");
        let s = location("return 200 a}b;").unwrap().unwrap();
        assert_eq!(s.as_str(), "return 200 \"a}b\";");
        // An escaped quote keeps the string open: what looks like a
        // breakout is one header value, and is written as one.
        let s = location(r#"add_header X "a\"; } } } load_module /x.so; http {";"#)
            .unwrap()
            .unwrap();
        assert_eq!(s.as_str(), r#"add_header X "a\"; } } } load_module /x.so; http {";"#);
    }

    #[test]
    fn code_process_and_controller_directives_are_refused_anywhere() {
        for (text, why) in [
            ("ssl_engine /tmp/x.so;", "loads code"),
            ("if ($a) { load_module /tmp/x.so; }", "loads code"),
            (
                "location /a { location /b { include /etc/passwd; } }",
                "configuration from a file",
            ),
            ("env LD_PRELOAD=/tmp/x.so;", "process"),
            ("content_by_lua_block { ngx.say(1); }", "loads code"),
            ("access_by_lua 'x';", "loads code"),
            ("js_content main;", "loads code"),
            ("perl_set $x 'sub { 1 }';", "loads code"),
            ("\"load_module\" /tmp/x.so;", "loads code"),
            ("LOAD_MODULE /tmp/x.so;", "loads code"),
            ("dynamic_balancer_backend other-ns-svc-80;", "controller"),
            ("dynamic_balancer_api;", "controller"),
            ("proxy_ssl_conf_command Certificate /etc/x;", "OpenSSL"),
            ("proxy_store /tmp/$uri;", "writes files"),
            ("listen 10246;", "controller's"),
            ("server_name victim.example;", "controller's"),
            ("client_body_temp_path /tmp/x;", "writes files"),
        ] {
            let e = refused(text);
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn files_only_under_allowed_paths() {
        for text in [
            "root /;",
            "alias /var/run/secrets/kubernetes.io/serviceaccount/;",
            "auth_basic_user_file /etc/shadow;",
            "ssl_certificate /proc/self/fd/3;",
            "proxy_ssl_certificate_key /proc/1/fd/12;",
            "access_log /etc/ingress-controller/nginx.conf;",
            "error_log api-token;",
            "root /srv/static/$http_x;",
        ] {
            let e = refused(text);
            assert!(e.contains("refused in a snippet"), "{text:?}: {e}");
        }
        let policy = Policy::new(vec![PathBuf::from("/srv/static")]).unwrap();
        let ok = |t: &str| Snippet::parse(t, &policy);
        assert!(ok("root /srv/static/site;").is_ok());
        assert!(ok("access_log off;").is_ok());
        assert!(ok("access_log /dev/stdout;").is_ok());
        assert!(ok("root /srv/static/../../etc;").is_err());
        assert!(ok("alias /proc/self/;").is_err());
        assert!(Policy::new(vec![PathBuf::from("/")]).is_err());
        assert!(Policy::new(vec![PathBuf::from("/proc/1")]).is_err());
    }

    #[test]
    fn pass_targets_and_reserved_variables() {
        for text in [
            "location /x { proxy_pass http://127.0.0.1:10246; }",
            "location /x { proxy_pass http://unix:/etc/ingress-controller/https.sock; }",
            "location /x { proxy_pass http://[::1]:80; }",
            "location /x { proxy_pass http://localhost/; }",
            "location /x { proxy_pass http://169.254.169.254/latest; }",
            "location /x { proxy_pass http://0x7f000001/; }",
            "location /x { proxy_pass http://$arg_to; }",
            "location /x { proxy_pass http://upstream_balancer; }",
            "location /x { grpc_pass grpcs://upstream_balancer_grpcs_sni_a.test; }",
            "location /x { grpc_pass grpc://127.0.0.1:9000; }",
            "location /x { fastcgi_pass unix:/run/php.sock; }",
            "set $proxy_upstream_name other-ns-svc-80;",
            "set $namespace other;",
            "auth_request_set $proxy_upstream_name $upstream_http_x;",
        ] {
            let e = refused(text);
            assert!(e.contains("refused in a snippet"), "{text:?}: {e}");
        }
        assert!(location("location /x { proxy_pass http://example.com:8080/a; }").is_ok());
        assert!(location("set $my_var 1;").is_ok());
    }

    #[test]
    fn sizes_and_characters_are_bounded() {
        assert!(refused(&"add_header a b;\n".repeat(5000)).contains("bytes"));
        assert!(refused(&"a;".repeat(2500)).contains("directives"));
        assert!(refused(&format!("{}{}", "if ($a) {".repeat(9), "}".repeat(9))).contains("nested"));
        assert!(refused("add_header a \"b\u{0}c\";").contains("control character"));
        assert!(refused(&format!("add_header a {};", "x".repeat(4050))).contains("too long"));
    }
}
