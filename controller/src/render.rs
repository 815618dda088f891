//! Rendering the [`Structure`] into nginx.conf with minijinja.
//!
//! The template is data, users may replace it (`--template`), so the
//! renderer enforces the injection rules itself rather than trusting the
//! template to escape: every `{{ value }}` becomes exactly one nginx token.
//! Plain words are written as they are; anything else is double-quoted with
//! `\` and `"` escaped; control characters (newlines included) and `$` abort
//! the render. The only way to emit a `$` is the `regex` filter, which the
//! template applies to values the model has already validated as regexes or
//! rewrite targets. Snippets, allowed only by an explicit flag, go through
//! the `snippet` filter, which writes nginx directives only as a complete,
//! balanced list (it parses them again and writes them in canonical form),
//! so not even a replaced template can let one out of its block.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use minijinja::value::{Enumerator, Object, ObjectRepr, Value};
use minijinja::{Environment, Error, ErrorKind, Output, State};
use serde::Serialize;

use crate::model::Structure;

/// The template compiled into the binary; `--template` overrides it.
pub const DEFAULT_TEMPLATE: &str = include_str!("../templates/nginx.conf.j2");
const TEMPLATE_NAME: &str = "nginx.conf";

/// Values from the command line, not from users.
#[derive(Debug, Clone, Serialize)]
pub struct RenderContext {
    pub module_path: String,
    pub pid_file: String,
    pub error_log: String,
    pub error_log_level: String,
    pub access_log: String,
    pub zone_size: String,
    /// The generated default certificate ([`crate::default_certificate`]):
    /// every TLS server's static `ssl_certificate`.
    pub default_certificate: String,
    /// The controller runs nginx in the foreground itself.
    pub supervised: bool,
    /// The file with the API's bearer token (`dynamic_balancer_api_token_file`).
    pub api_token_file: Option<String>,
    /// Request metrics: `dynamic_balancer_metrics` in every Ingress location.
    pub metrics: bool,
    /// The `host` label of request metrics is the server name (else empty).
    pub metrics_per_host: bool,
    /// This machine's CPUs: the workers `worker_processes auto` starts,
    /// which the metrics zone is sized for.
    pub cpus: usize,
    /// With `--enable-ssl-passthrough`: the Unix socket the HTTP servers'
    /// TLS listener moves to, behind `stream {}` on the HTTPS port.
    pub https_socket: String,
    /// The directory of nginx's other Unix sockets (the configuration
    /// directory): a Gateway TLS listener's twin for backend TLS listens
    /// there ([`crate::nginx::BACKEND_TLS_SOCKET_PREFIX`]).
    pub socket_dir: String,
    /// `<conf-dir>/auth`, absolute: the basic-auth user files and client
    /// CA bundles. Absolute because nginx resolves such names against the
    /// directory of the file it reads, and a candidate is tested from the
    /// staging directory.
    pub auth_dir: String,
}

pub struct Renderer {
    env: Environment<'static>,
}

fn is_plain(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./:@*=~^-,".contains(&b))
}

/// Writes `s` as one nginx token: bare when plain, else quoted.
fn write_token(out: &mut impl std::fmt::Write, s: &str, allow_dollar: bool) -> Result<(), Error> {
    if let Some(c) = s.chars().find(|c| c.is_control() || (*c == '$' && !allow_dollar)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("refusing to render {c:?} from a value into nginx.conf: {s:?}"),
        ));
    }
    let io = |e: std::fmt::Error| Error::new(ErrorKind::WriteFailure, e.to_string());
    if is_plain(s) && !s.starts_with('~') && !s.starts_with('=') {
        return out.write_str(s).map_err(io);
    }
    let mut quoted = String::with_capacity(s.len() + 2);
    quoted.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    out.write_str(&quoted).map_err(io)
}

fn formatter(out: &mut Output, _state: &State, value: &Value) -> Result<(), Error> {
    if value.is_safe() {
        return out
            .write_str(value.as_str().unwrap_or_default())
            .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()));
    }
    if value.is_undefined() || value.is_none() {
        return Err(Error::new(
            ErrorKind::UndefinedError,
            "an undefined value reached nginx.conf",
        ));
    }
    match value.as_str() {
        Some(s) => write_token(out, s, false),
        None => write_token(out, &value.to_string(), false),
    }
}

/// `{{ block|reindent(4) }}`: the template's own rendered lines (a macro's
/// output), each indented by `width` spaces instead. Only for text the
/// template produced: anything else is refused.
fn reindent_filter(value: Value, width: usize) -> Result<Value, Error> {
    if !value.is_safe() {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "reindent takes only the template's own output",
        ));
    }
    let pad = " ".repeat(width);
    let text = value.as_str().unwrap_or_default();
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        out.push_str(&pad);
        out.push_str(line.trim_start());
        out.push('\n');
    }
    Ok(Value::from_safe_string(out))
}

/// `{{ value|regex("(?i)") }}`: a quoted token in which `$` may
/// appear (regex anchors, `$1` captures). Only for validated regexes and
/// rewrite targets.
fn regex_filter(value: String, prefix: Option<String>) -> Result<Value, Error> {
    let mut out = String::new();
    write_token(&mut out, &format!("{}{value}", prefix.unwrap_or_default()), true)?;
    Ok(Value::from_safe_string(out))
}

/// `{{ value|after("$scheme://$host") }}`: a quoted token made of the
/// template's own variable prefix and a `$`-free value.
fn after_filter(value: String, prefix: String) -> Result<Value, Error> {
    if value.contains('$') {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("refusing `$` in {value:?}"),
        ));
    }
    regex_filter(value, Some(prefix))
}

/// `{{ value|literal_dollar }}`: one quoted token in which every `$` of the
/// value is written `${literal_dollar}` (the template's `geo` variable
/// holding a literal dollar), so nginx never reads a variable from it.
fn literal_dollar_filter(value: String) -> Result<Value, Error> {
    let mut out = String::new();
    write_token(&mut out, &value.replace('$', "${literal_dollar}"), true)?;
    Ok(Value::from_safe_string(out))
}

/// `{{ value|variables }}`: a quoted token in which `$` may appear only as
/// a variable the model allows in URLs and cache keys
/// ([`crate::model::external_auth::known_variable`]): checked again here,
/// so a template or model mistake cannot name any other variable.
fn variables_filter(value: String) -> Result<Value, Error> {
    let mut rest = value.as_str();
    while let Some(at) = rest.find('$') {
        let after = rest[at + 1..].strip_prefix('{').unwrap_or(&rest[at + 1..]);
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !crate::model::external_auth::known_variable(&name.to_ascii_lowercase(), true) {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("refusing ${name} in {value:?}"),
            ));
        }
        rest = &after[name.len()..];
    }
    regex_filter(value, None)
}

/// `{{ value|log_format }}`: a quoted token in which `$` may appear only
/// as a variable a log format may name
/// ([`crate::model::log_format::variable_allowed`]), checked again here.
fn log_format_filter(value: String) -> Result<Value, Error> {
    let names = crate::model::log_format::variables(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("{e} in {value:?}")))?;
    if let Some(bad) = names.iter().find(|n| !crate::model::log_format::variable_allowed(n)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("refusing ${bad} in {value:?}"),
        ));
    }
    regex_filter(value, None)
}

/// `{{ value|snippet(12) }}`: a judged snippet ([`crate::model::snippet`])
/// as directives, lines after the first indented by `indent` spaces. The
/// text is parsed again and written from the parse: anything that is not a
/// complete list of directives with balanced blocks aborts the render.
fn snippet_filter(value: String, indent: usize) -> Result<Value, Error> {
    use crate::conf_syntax::{emit, parse};
    let tree = parse::parse(&value, parse::Limits::default()).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("refusing to render a snippet that is not a complete list of directives: {e}"),
        )
    })?;
    let text = emit::directives(&tree, indent);
    Ok(Value::from_safe_string(text.trim_start_matches(' ').to_string()))
}

/// `{{ value|comment }}`: text safe inside a `#` comment (one line).
fn comment_filter(value: String) -> Value {
    let line: String = value.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    Value::from_safe_string(line)
}

impl Renderer {
    /// Loads `--template` when given, else the built-in one.
    pub fn new(template: Option<&Path>) -> anyhow::Result<Self> {
        let source = match template {
            Some(path) => {
                std::fs::read_to_string(path).with_context(|| format!("reading template {}", path.display()))?
            }
            None => DEFAULT_TEMPLATE.to_string(),
        };
        let mut env = Environment::new();
        env.set_formatter(formatter);
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_filter("regex", regex_filter);
        env.add_filter("after", after_filter);
        env.add_filter("literal_dollar", literal_dollar_filter);
        env.add_filter("comment", comment_filter);
        env.add_filter("variables", variables_filter);
        env.add_filter("log_format", log_format_filter);
        // Header values (add-headers, proxy-set-headers) follow the same
        // rule: text, and variables nginx knows.
        env.add_filter("header_value", log_format_filter);
        env.add_filter("label", label_filter);
        env.add_filter("snippet", snippet_filter);
        env.add_filter("reindent", reindent_filter);
        env.add_template_owned(TEMPLATE_NAME, source)
            .context("compiling the nginx.conf template")?;
        Ok(Renderer { env })
    }

    pub fn render(&self, structure: &Arc<Structure>, ctx: &RenderContext) -> anyhow::Result<String> {
        let tmpl = self.env.get_template(TEMPLATE_NAME)?;
        let text = tmpl
            .render(minijinja::context! {
                s => structure_value(structure),
                ctx => Value::from_serialize(ctx),
                limits => Value::from_serialize(limits(structure)),
                metrics_zone_size => metrics_zone_size(structure, ctx.cpus),
                otel_used => structure.global.otel.enabled
                    || structure.servers.iter().any(|srv| srv.locations.iter().any(|l| l.otel.is_some())),
                otel_exporter => structure.global.otel.exporter_directive(),
                otel_sampler => structure.global.otel.sampler_directive(),
                auth_upstreams => Value::from_serialize(auth_upstreams(structure)),
            })
            .map_err(|e| anyhow::anyhow!("rendering nginx.conf: {e:#}"))?;
        Ok(text)
    }
}

/// The template's `s`: the structure as minijinja values, except that
/// `s.servers` is a sequence whose items are converted when the template
/// reaches them. Converted at once, the servers of 10,000 Ingresses were a
/// tree of about 40 MB next to the structure itself, the largest part of
/// the controller's peak memory; one at a time, a server's tree lives while
/// the template renders it.
fn structure_value(structure: &Arc<Structure>) -> Value {
    // `Structure` does not serialize its servers (`#[serde(skip)]`).
    let rest = Value::from_serialize(&**structure);
    let mut map: std::collections::BTreeMap<Value, Value> = match rest.try_iter() {
        Ok(keys) => keys
            .filter_map(|k| {
                let v = rest.get_item(&k).ok()?;
                Some((k, v))
            })
            .collect(),
        Err(_) => Default::default(),
    };
    map.insert(
        Value::from("servers"),
        Value::from_object(LazyServers(structure.clone())),
    );
    Value::from(map)
}

/// `s.servers`, each item converted on access.
#[derive(Debug)]
struct LazyServers(Arc<Structure>);

impl Object for LazyServers {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let server = self.0.servers.get(key.as_usize()?)?;
        Some(Value::from_serialize(server))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.0.servers.len())
    }
}

/// An auth-keepalive upstream and the Ingress whose location declares it.
#[derive(Serialize)]
struct AuthUpstream<'a> {
    ingress: &'a str,
    upstream: &'a crate::model::external_auth::AuthUpstream,
}

/// The `upstream {}` blocks of `auth-keepalive`, gathered here so that the
/// template need not walk every server twice.
fn auth_upstreams(structure: &Structure) -> Vec<AuthUpstream<'_>> {
    structure
        .servers
        .iter()
        .flat_map(|s| &s.locations)
        .filter_map(|l| {
            let upstream = l.external_auth.as_ref()?.upstream.as_ref()?;
            Some(AuthUpstream {
                ingress: &l.ingress,
                upstream,
            })
        })
        .collect()
}

/// The metrics zone's size for this structure: per location 8 KiB (its
/// series and a canary's) and 6 KiB per worker (cells of 1 KiB, the slab's
/// size class for a cell's 7 histograms, for the half dozen method and
/// status pairs a location typically sees), rounded up to a power of two
/// between 16m and 1g. Rounding keeps the size, and so the zone and its counts, across most
/// reloads: nginx makes a new zone when the size changes. `cpus` is what
/// `worker_processes auto` means here.
pub fn metrics_zone_size(s: &Structure, cpus: usize) -> String {
    let workers = match s.global.worker_processes {
        0 => cpus,
        n => n as usize,
    }
    .max(1);
    let locations: usize = s.servers.iter().map(|srv| srv.locations.len()).sum();
    format!("{}m", metrics_zone_mib(locations, workers))
}

/// Cells of 1 KiB a worker is expected to make per location.
const CELLS_PER_WORKER: usize = 6;

/// [`metrics_zone_size`] in MiB for `locations` and `workers`.
fn metrics_zone_mib(locations: usize, workers: usize) -> usize {
    let kib = locations.saturating_mul(8usize.saturating_add(workers.saturating_mul(CELLS_PER_WORKER)));
    kib.div_ceil(1024).next_power_of_two().clamp(16, 1024)
}

/// `{{ value|label }}`: one quoted token for a literal directive argument
/// that the module reads as data, never as a variable (so `$` is kept).
fn label_filter(value: String) -> Result<Value, Error> {
    let mut out = String::new();
    write_token(&mut out, &value, true)?;
    Ok(Value::from_safe_string(out))
}

/// One `limit_req_zone`/`limit_conn_zone` pair per Ingress that asks for
/// limits; every location of that Ingress shares them, as in ingress-nginx.
#[derive(Serialize)]
struct LimitZone {
    id: usize,
    rps: Option<u32>,
    rpm: Option<u32>,
    connections: Option<u32>,
    /// `limit-allowlist`: the zones are keyed by `$limit_<id>`, empty (not
    /// counted) for these clients.
    allowlist: Vec<String>,
}

fn limits(s: &Structure) -> Vec<LimitZone> {
    let mut zones: std::collections::BTreeMap<usize, LimitZone> = Default::default();
    for l in s.servers.iter().flat_map(|srv| &srv.locations) {
        if l.limit_rps.is_some() || l.limit_rpm.is_some() || l.limit_connections.is_some() {
            zones.entry(l.id).or_insert(LimitZone {
                id: l.id,
                rps: l.limit_rps,
                rpm: l.limit_rpm,
                connections: l.limit_connections,
                allowlist: l.limit_allowlist.clone(),
            });
        }
    }
    zones.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(s: &str) -> Result<String, Error> {
        let mut out = String::new();
        write_token(&mut out, s, false)?;
        Ok(out)
    }

    #[test]
    fn plain_words_stay_bare_and_others_are_quoted() {
        assert_eq!(token("example.com").unwrap(), "example.com");
        assert_eq!(token("a b").unwrap(), "\"a b\"");
        assert_eq!(token("a\"b;}").unwrap(), "\"a\\\"b;}\"");
        assert_eq!(token("~x").unwrap(), "\"~x\"");
    }

    #[test]
    fn literal_dollars_never_read_a_variable() {
        let v = literal_dollar_filter("/foo(/|$)(.*)".into()).unwrap();
        assert_eq!(v.as_str().unwrap(), "\"/foo(/|${literal_dollar})(.*)\"");
        assert!(literal_dollar_filter("a\nb".into()).is_err());
    }

    #[test]
    fn the_metrics_zone_grows_with_locations_and_workers() {
        // A cell (a list pointer, worker, method, status, then the
        // counters) fits the 1 KiB slab class the estimate counts.
        assert!(std::mem::size_of::<lua_compat::metrics::Counters>() + 16 <= 1024);
        assert_eq!(metrics_zone_mib(0, 2), 16);
        assert_eq!(metrics_zone_mib(800, 2), 16);
        assert_eq!(metrics_zone_mib(1000, 2), 32);
        // 64 workers: 392 KiB per location.
        assert_eq!(metrics_zone_mib(100, 64), 64);
        assert_eq!(metrics_zone_mib(1000, 64), 512);
        assert_eq!(metrics_zone_mib(100_000, 256), 1024);
        assert_eq!(metrics_zone_mib(usize::MAX, usize::MAX), 1024);
    }

    #[test]
    fn control_characters_and_dollars_never_render() {
        for bad in ["a\nb", "a\rb", "x$host", "\u{0}"] {
            assert!(token(bad).is_err(), "{bad:?}");
        }
    }
}
