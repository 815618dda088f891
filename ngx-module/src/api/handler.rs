//! The `/configuration` API content handler (`dynamic_balancer_api`).
//!
//! Reads run on the event loop: they copy blobs out of the zone under its read
//! lock. Writes (POST, PUT, DELETE) run on the worker's low-priority parser
//! thread (see [`crate::api::offload`]): parsing a 1 MB body and writing the zone
//! never stall traffic, and the event loop never waits on the zone's mutex.

use std::ptr;
use std::sync::atomic::Ordering;

use lua_compat::api::{
    check_access, json_array, route, Action, Denied, EndpointHealth, EndpointTableStatus, ErrorBody, Method,
    RouteError, Status, WorkerStatus, ZoneUsage,
};
use lua_compat::routes::validate::parse_routes;
use lua_compat::runtime::RuntimeBackend;
use lua_compat::runtime::{prepare_backend, prepare_backends};
use lua_compat::ValidationError;
use ngx::ffi::{
    ngx_http_discard_request_body, ngx_http_finalize_request, ngx_http_read_client_request_body, ngx_http_request_t,
    ngx_int_t, ngx_uint_t, NGX_DONE, NGX_HTTP_DELETE, NGX_HTTP_GET, NGX_HTTP_INTERNAL_SERVER_ERROR, NGX_HTTP_POST,
    NGX_HTTP_PUT, NGX_HTTP_SPECIAL_RESPONSE, NGX_LOG_ERR, NGX_LOG_INFO, NGX_LOG_WARN, NGX_OK,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, Request};
use ngx::ngx_log_error;

use crate::api::certificates::{self, CertOutcome, CertWrite};
use crate::api::offload::offload;
use crate::conf::zone_of;
use crate::http::metrics;
use crate::http::request_ctx::{self, BodyBudget, BodyTarget, PendingWrite};
use crate::nginx::guard::ffi_guard;
use crate::nginx::module::Module;
use crate::nginx::request::{
    body_parts, read_body_parts, send_json, send_json_with, send_prometheus_text, str_bytes, BodyPart,
};
use crate::shm::routes;
use crate::shm::store::{apply, now_ms, Change, StoreError};
use crate::shm::zone::Zone;

const OK: ngx_uint_t = 200;
const UNAUTHORIZED: ngx_uint_t = 401;
const FORBIDDEN: ngx_uint_t = 403;
const CREATED: ngx_uint_t = 201;
const NO_CONTENT: ngx_uint_t = 204;
const BAD_REQUEST: ngx_uint_t = 400;
const NOT_FOUND: ngx_uint_t = 404;
const METHOD_NOT_ALLOWED: ngx_uint_t = 405;
const PAYLOAD_TOO_LARGE: ngx_uint_t = 413;
const INTERNAL_ERROR: ngx_uint_t = 500;
const INSUFFICIENT_STORAGE: ngx_uint_t = 507;

const WHAT_REPLACE: &str = "replaced all backends";
const WHAT_PUT: &str = "stored backend";
const WHAT_DELETE: &str = "deleted backend";
const WHAT_ROUTES: &str = "replaced the route table";
const WHAT_ROUTES_SAME: &str = "route table unchanged";

/// One write, as the parser thread receives it.
enum Write {
    Replace(Vec<BodyPart>),
    Put(String, Vec<BodyPart>),
    Delete(String),
    /// A certificate or servers write with its body (if any).
    Cert(BodyTarget, Vec<BodyPart>),
    DeleteCertificate(String),
    /// `PUT /configuration/routes`.
    Routes(Vec<BodyPart>),
}

struct WriteJob {
    zone: Zone,
    write: Write,
}

/// What the thread hands back.
enum WriteOutcome {
    /// `status` is 201 for POST and for PUT of a new backend, 200 for PUT of
    /// an existing one, 204 for DELETE.
    Applied {
        generation: u64,
        status: ngx_uint_t,
        what: &'static str,
        warnings: Vec<String>,
        /// Endpoints routed without shared state (the table is full).
        untracked: u64,
    },
    Invalid(ValidationError),
    Store(StoreError, String),
    Unreadable(String),
    Certificates(CertOutcome),
}

/// The location handler: nginx calls it in the content phase with a live
/// request whose header has not been sent.
pub unsafe extern "C" fn api_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    ffi_guard("api handler", NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t, || {
        // SAFETY: nginx runs content handlers with a live request, its
        // header unsent, on the event loop, and holds no reference into it
        // meanwhile.
        let req = unsafe { Request::from_ngx_http_request(r) };
        let job = match handle(req) {
            Handled::Return(rc) => return rc,
            Handled::Offload(job) => job,
        };
        // `offload` takes the request as a pointer (see there); `req` is not
        // used from here on.
        let r = ptr::from_mut(req.as_mut());
        // Hold the request until the thread answers, as reading a body does.
        // SAFETY: `r` is live, and so is its main request (itself: `refuse`
        // answers subrequests); only the event loop touches it, and no
        // reference to it is live.
        unsafe { (*(*r).main).set_count((*(*r).main).count() + 1) };
        // SAFETY: `r` is live and otherwise unreferenced, and the count just
        // taken is the one `offload` releases when it finalizes the request.
        unsafe {
            match job {
                Offloaded::Write(job) => offload(r, job, run_write, finish_write),
                Offloaded::Metrics(scrape) => offload(r, scrape, metrics::render, finish_metrics),
            }
        }
        NGX_DONE as ngx_int_t
    })
}

/// What [`handle`] leaves to the hook.
enum Handled {
    /// What the content phase returns.
    Return(ngx_int_t),
    /// Work for the worker's offload thread: the hook takes a reference on
    /// the request and offloads it, once no reference to the request is live.
    Offload(Offloaded),
}

/// What [`handle`] leaves to the offload thread.
enum Offloaded {
    /// A DELETE.
    Write(WriteJob),
    /// `GET /configuration/metrics`: the zone's copy, to format.
    /// Boxed: the copy carries several counter sets, and the variant
    /// travels by value through the offload queue.
    Metrics(Box<metrics::Scrape>),
}

/// Answers one API request, or starts its write. Called in the content
/// phase, before the header is sent.
fn handle(req: &mut Request) -> Handled {
    if let Some(rc) = refuse(req) {
        return Handled::Return(rc);
    }
    let Some(zone) = zone_of(req) else {
        return Handled::Return(error(
            req,
            INTERNAL_ERROR,
            "dynamic_balancer_zone is not configured",
            None,
        ));
    };
    let method = match req.as_ref().method as u32 {
        NGX_HTTP_GET => Method::Get,
        NGX_HTTP_POST => Method::Post,
        NGX_HTTP_PUT => Method::Put,
        NGX_HTTP_DELETE => Method::Delete,
        _ => Method::Other,
    };
    let path = String::from_utf8_lossy(req.as_ref().uri.as_bytes()).into_owned();
    let action = route(method, &path);
    let body_target = match &action {
        Ok(Action::ReplaceBackends) => Some(BodyTarget::ReplaceBackends),
        Ok(Action::PutBackend(name)) => Some(BodyTarget::PutBackend(name.to_string())),
        Ok(Action::PutCertificate(id)) => Some(BodyTarget::PutCertificate(id.to_string())),
        Ok(Action::PutServers) => Some(BodyTarget::PutServers),
        Ok(Action::PostServers) => Some(BodyTarget::PostServers),
        Ok(Action::PutRoutes) => Some(BodyTarget::PutRoutes),
        _ => None,
    };
    if let Some(target) = body_target {
        return Handled::Return(start_write(req, target));
    }
    // SAFETY: the pointer comes from `req`, the live request, in its content
    // handler; nothing else borrows it during the call.
    let rc = unsafe { ngx_http_discard_request_body(ptr::from_mut(req.as_mut())) };
    if rc != NGX_OK as ngx_int_t {
        return Handled::Return(rc);
    }
    Handled::Return(match action {
        Err(RouteError::NotFound) => error(req, NOT_FOUND, &format!("no route for {path}"), None),
        Err(RouteError::MethodNotAllowed(allow)) => {
            let body = ErrorBody {
                error: &format!("method not allowed; use {allow}"),
                path: None,
            }
            .to_json();
            send_json(req, METHOD_NOT_ALLOWED, &body, Some(allow))
        }
        Ok(Action::ListBackends) => {
            let index = zone.header().index.read();
            let body = json_array(index.blobs().map(|b| b.json()));
            drop(index);
            send_json(req, OK, &body, None)
        }
        Ok(Action::GetBackend(name)) => {
            let index = zone.header().index.read();
            let body = index.find(name.as_bytes()).map(|b| b.json().to_vec());
            drop(index);
            match body {
                Some(body) => send_json(req, OK, &body, None),
                None => error(req, NOT_FOUND, &format!("no backend named {name:?}"), None),
            }
        }
        Ok(Action::Status) => {
            let state_file = Module::main_conf(req).and_then(|m| m.state_file.as_deref());
            let body = status(&zone, state_file);
            send_json(req, OK, &body, None)
        }
        Ok(Action::Health) => send_json(req, OK, &health(&zone), None),
        Ok(Action::Metrics) => match lua_compat::metrics::StatusLabel::from_query(str_bytes(&req.as_ref().args)) {
            Ok(status) => return Handled::Offload(Offloaded::Metrics(Box::new(metrics::scrape(req, status)))),
            Err(e) => error(req, BAD_REQUEST, &e, None),
        },
        Ok(Action::DeleteBackend(name)) => {
            return Handled::Offload(Offloaded::Write(WriteJob {
                zone,
                write: Write::Delete(name.to_string()),
            }))
        }
        Ok(Action::ListCertificates) => {
            let body = certificates::listing(&zone, None).unwrap_or_default();
            send_json(req, OK, &body, None)
        }
        Ok(Action::GetCertificate(id)) => match certificates::listing(&zone, Some(id)) {
            Some(body) => send_json(req, OK, &body, None),
            None => error(req, NOT_FOUND, &format!("no certificate {id:?}"), None),
        },
        Ok(Action::GetServers) => send_json(req, OK, &certificates::servers(&zone), None),
        Ok(Action::GetRoutes) => {
            let (_, json) = routes::read(&zone);
            send_json(req, OK, json.as_deref().unwrap_or(br#"{"listeners":[]}"#), None)
        }
        Ok(Action::DeleteCertificate(id)) => {
            return Handled::Offload(Offloaded::Write(WriteJob {
                zone,
                write: Write::DeleteCertificate(id.to_string()),
            }))
        }
        Ok(
            Action::ReplaceBackends
            | Action::PutBackend(_)
            | Action::PutCertificate(_)
            | Action::PutServers
            | Action::PostServers
            | Action::PutRoutes,
        ) => unreachable!("handled above"),
    })
}

/// The API's own protection, whatever address it listens on: it answers
/// only requests that come straight from a client (never a subrequest, an
/// internal redirect or anything carrying proxy headers, so no path through
/// nginx's public servers reaches it), and, with a token configured, only
/// requests that present it. Returns the response when refused. Called in
/// the content phase, before the header is sent.
fn refuse(req: &mut Request) -> Option<ngx_int_t> {
    let denied = if !req.is_main() || req.as_ref().internal() != 0 {
        Some(Denied::Proxied("an internal redirect or subrequest"))
    } else {
        let token = Module::location_conf(req).and_then(|c| c.token.as_deref());
        let headers = req.headers_in_iterator().map(|(k, v)| (k.as_bytes(), v.as_bytes()));
        check_access(headers, token).err()
    }?;
    // SAFETY: the pointer comes from `req`, the live request, in its content
    // handler; nothing else borrows it during the call.
    let rc = unsafe { ngx_http_discard_request_body(ptr::from_mut(req.as_mut())) };
    if rc != NGX_OK as ngx_int_t {
        return Some(rc);
    }
    // SAFETY: a live request's connection outlives it; it is a separate
    // allocation, only read here.
    let connection = unsafe { &*req.connection() };
    let addr = String::from_utf8_lossy(connection.addr_text.as_bytes()).into_owned();
    Some(match denied {
        Denied::Proxied(how) => {
            ngx_log_error!(
                NGX_LOG_WARN,
                connection.log,
                "dynamic_balancer: API request from {addr} refused: it came through a proxy ({how})"
            );
            let msg = format!("the configuration API does not answer proxied requests ({how})");
            error(req, FORBIDDEN, &msg, None)
        }
        Denied::Unauthorized => {
            // The token is never logged.
            ngx_log_error!(
                NGX_LOG_WARN,
                connection.log,
                "dynamic_balancer: API request from {addr} refused: missing or wrong bearer token"
            );
            req.as_mut().set_keepalive(0);
            let body = ErrorBody {
                error: "a bearer token is required (Authorization: Bearer <token>)",
                path: None,
            }
            .to_json();
            send_json_with(
                req,
                UNAUTHORIZED,
                &body,
                &[("WWW-Authenticate", "Bearer realm=\"dynamic_balancer\"")],
            )
        }
    })
}

/// Checks the declared size and reads the body; the write goes on in
/// `body_ready`. Called in the content phase, before the header is sent and
/// the body read.
fn start_write(req: &mut Request, target: BodyTarget) -> ngx_int_t {
    let max = Module::location_conf(req).map_or(0, |c| c.max_body);
    if max > 0 && req.as_ref().headers_in.content_length_n > max {
        // As nginx does for its own 413: no "100 Continue", drop the body,
        // and close the connection afterwards.
        req.as_mut().set_expect_tested(1);
        // SAFETY: the pointer comes from `req`, the live request, in its
        // content handler; nothing else borrows it during the call.
        let rc = unsafe { ngx_http_discard_request_body(ptr::from_mut(req.as_mut())) };
        if rc != NGX_OK as ngx_int_t {
            return rc;
        }
        return too_large(req, max);
    }
    let pending = PendingWrite {
        target,
        budget: BodyBudget::default(),
    };
    if request_ctx::attach_write(req, pending).is_none() {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    }
    // SAFETY: the pointer comes from `req`, the live request, whose body is
    // unread; `body_ready` is the handler nginx calls once it is.
    let rc = unsafe { ngx_http_read_client_request_body(ptr::from_mut(req.as_mut()), Some(body_ready)) };
    if rc >= NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
        req.as_mut().set_keepalive(0);
        // Reading failed before any header was sent.
        return error(req, rc as ngx_uint_t, "the request body could not be read", None);
    }
    NGX_DONE as ngx_int_t
}

/// Answers 413 and closes the connection afterwards.
fn too_large(req: &mut Request, max: i64) -> ngx_int_t {
    req.as_mut().set_keepalive(0);
    let msg = format!("request body is larger than client_max_body_size ({max} bytes)");
    error(req, PAYLOAD_TOO_LARGE, &msg, None)
}

/// The body is in: hand it to the parser thread. nginx calls it once the
/// body of the live request was read, with the request's count still held
/// by the read.
unsafe extern "C" fn body_ready(r: *mut ngx_http_request_t) {
    let panicked = ffi_guard("request body handler", true, || {
        // SAFETY: nginx calls the body handler with the live request whose
        // body it read, on the event loop, and holds no reference into it
        // meanwhile.
        let req = unsafe { Request::from_ngx_http_request(r) };
        // SAFETY: the pending write lives in the request's pool; only this
        // handler uses it now (the body filter is done), and only here.
        let Some(pending) = (unsafe { request_ctx::pending_write(req) }) else {
            // SAFETY: the pointer comes from `req`, the live request, which
            // is not used after; finalizing releases the read's count.
            unsafe {
                ngx_http_finalize_request(ptr::from_mut(req.as_mut()), NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t)
            };
            return false;
        };
        let max = Module::location_conf(req).map_or(0, |c| c.max_body);
        if pending.budget.too_large {
            let rc = too_large(req, max);
            // SAFETY: the pointer comes from `req`, the live request, which
            // is not used after; finalizing with the answer's code releases
            // the read's count.
            unsafe { ngx_http_finalize_request(ptr::from_mut(req.as_mut()), rc) };
            return false;
        }
        let Some(zone) = zone_of(req) else {
            // SAFETY: the pointer comes from `req`, the live request, which
            // is not used after; finalizing releases the read's count.
            unsafe {
                ngx_http_finalize_request(ptr::from_mut(req.as_mut()), NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t)
            };
            return false;
        };
        // SAFETY: the request's body was fully read.
        let parts = unsafe { body_parts(req) };
        let write = match pending.target.clone() {
            BodyTarget::ReplaceBackends => Write::Replace(parts),
            BodyTarget::PutBackend(name) => Write::Put(name, parts),
            BodyTarget::PutRoutes => Write::Routes(parts),
            cert => Write::Cert(cert, parts),
        };
        // SAFETY: the pointer comes from `req`, the live request, which is
        // not used after (`offload` takes a pointer, see there); the read's
        // count is the one `offload` releases when it finalizes the request.
        unsafe {
            offload(
                ptr::from_mut(req.as_mut()),
                WriteJob { zone, write },
                run_write,
                finish_write,
            )
        };
        false
    });
    if panicked {
        // Nothing was handed over; the request still needs its answer.
        // SAFETY: `r` is the live request nginx passed in, still holding
        // the read's count, which finalizing releases; the closure's
        // reference to it is gone.
        unsafe { ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t) };
    }
}

/// On the parser thread: read the body (spooled parts too), parse, validate,
/// resolve `ExternalName`s, store.
fn run_write(job: WriteJob) -> WriteOutcome {
    let mut dns_warnings = Vec::new();
    let mut resolve = crate::backends::external_names::write_resolver(&mut dns_warnings);
    let (change, what, name) = match job.write {
        Write::DeleteCertificate(id) => {
            return WriteOutcome::Certificates(certificates::run(&job.zone, CertWrite::Delete(id)))
        }
        Write::Cert(target, parts) => {
            let body = match read_body_parts(&parts) {
                Ok(body) => body,
                Err(e) => return WriteOutcome::Unreadable(e.to_string()),
            };
            let write = match target {
                BodyTarget::PutCertificate(id) => CertWrite::Put(id, body),
                BodyTarget::PutServers => CertWrite::ReplaceServers(body),
                _ => CertWrite::Compat(body),
            };
            return WriteOutcome::Certificates(certificates::run(&job.zone, write));
        }
        Write::Routes(parts) => return write_routes(&job.zone, &parts),
        Write::Delete(name) => (Ok(Change::Delete(name.clone())), WHAT_DELETE, name),
        Write::Replace(parts) => match read_body_parts(&parts) {
            Ok(body) => (
                prepare_backends(&body, &mut resolve).map(Change::ReplaceAll),
                WHAT_REPLACE,
                String::new(),
            ),
            Err(e) => return WriteOutcome::Unreadable(e.to_string()),
        },
        Write::Put(name, parts) => match read_body_parts(&parts) {
            Ok(body) => (
                prepare_backend(&body, &name, &mut resolve).map(Change::Put),
                WHAT_PUT,
                name,
            ),
            Err(e) => return WriteOutcome::Unreadable(e.to_string()),
        },
    };
    drop(resolve);
    let mut warnings: Vec<String> = match &change {
        Ok(Change::ReplaceAll(items)) => items.iter().flat_map(|p| p.warnings.iter().cloned()).collect(),
        Ok(Change::Put(item)) => item.warnings.clone(),
        _ => Vec::new(),
    };
    warnings.extend(dns_warnings);
    match change {
        Err(e) => WriteOutcome::Invalid(e),
        Ok(change) => match apply(&job.zone, change) {
            Ok(a) => {
                // Written after the swap, while the answer goes out.
                crate::shm::state_file::changed();
                let status = match what {
                    WHAT_DELETE => NO_CONTENT,
                    WHAT_PUT if !a.created => OK,
                    _ => CREATED,
                };
                WriteOutcome::Applied {
                    generation: a.generation,
                    status,
                    what,
                    warnings,
                    untracked: a.untracked,
                }
            }
            Err(e) => WriteOutcome::Store(e, name),
        },
    }
}

/// `PUT /configuration/routes`, on the parser thread: the table is parsed
/// and validated, then stored in its canonical form.
fn write_routes(zone: &Zone, parts: &[BodyPart]) -> WriteOutcome {
    let body = match read_body_parts(parts) {
        Ok(body) => body,
        Err(e) => return WriteOutcome::Unreadable(e.to_string()),
    };
    let table = match parse_routes(&body) {
        Ok(table) => table,
        Err(e) => return WriteOutcome::Invalid(e),
    };
    // Client CA bundles are parsed by OpenSSL here, so that a worker never
    // meets one it cannot use in a handshake.
    for (i, l) in table.listeners.iter().enumerate() {
        if let Some(v) = &l.client_validation {
            if let Err(e) = crate::tls::client_ca::parse(&v.ca_certificates) {
                return WriteOutcome::Invalid(ValidationError {
                    path: format!("listeners[{i}].clientValidation.caCertificates"),
                    message: e,
                });
            }
        }
    }
    for (i, b) in table.backend_tls.iter().enumerate() {
        if let Some(pem) = &b.ca_certificates {
            if let Err(e) = crate::tls::client_ca::parse(pem) {
                return WriteOutcome::Invalid(ValidationError {
                    path: format!("backendTls[{i}].caCertificates"),
                    message: e,
                });
            }
        }
    }
    let json = serde_json::to_vec(&table).expect("JSON encoding of a route table");
    match routes::replace(zone, &json) {
        Ok(a) => WriteOutcome::Applied {
            generation: a.generation,
            status: OK,
            what: if a.changed { WHAT_ROUTES } else { WHAT_ROUTES_SAME },
            warnings: Vec::new(),
            untracked: 0,
        },
        Err(full) => WriteOutcome::Store(
            StoreError::ZoneFull {
                needed: full.needed,
                zone: full.zone,
            },
            String::new(),
        ),
    }
}

/// Back on the event loop: answer, and return the code `offload` finalizes
/// the request with. `None` means the thread panicked (it was caught;
/// nothing was stored). The header has not been sent yet.
/// Sends the formatted metrics (`None`: formatting panicked).
fn finish_metrics(req: &mut Request, body: Option<Vec<u8>>) -> ngx_int_t {
    match body {
        Some(body) => send_prometheus_text(req, &body),
        None => error(req, INTERNAL_ERROR, "internal error while formatting the metrics", None),
    }
}

fn finish_write(req: &mut Request, outcome: Option<WriteOutcome>) -> ngx_int_t {
    match outcome {
        None => error(
            req,
            INTERNAL_ERROR,
            "internal error while applying the configuration",
            None,
        ),
        Some(WriteOutcome::Applied {
            generation,
            status,
            what,
            warnings,
            untracked,
        }) => {
            let log = req.log();
            for w in warnings {
                ngx_log_error!(NGX_LOG_WARN, log, "dynamic_balancer: {w}");
            }
            if untracked > 0 {
                ngx_log_error!(
                    NGX_LOG_WARN,
                    log,
                    "dynamic_balancer: dynamic_balancer_zone has no room for more endpoint state: {untracked} endpoints route without shared health, connection and EWMA state (each backend keeps its fair share); increase dynamic_balancer_zone"
                );
            }
            ngx_log_error!(NGX_LOG_INFO, log, "dynamic_balancer: {what}, generation {generation}");
            let body = if status == NO_CONTENT {
                String::new()
            } else {
                format!("{{\"generation\":{generation}}}")
            };
            send_json(req, status, body.as_bytes(), None)
        }
        Some(WriteOutcome::Invalid(e)) => error(req, BAD_REQUEST, &e.message, Some(&e.path)),
        Some(WriteOutcome::Store(e, name)) => store_error(req, &e, &name),
        Some(WriteOutcome::Certificates(outcome)) => {
            let log = req.log();
            for w in &outcome.warnings {
                ngx_log_error!(NGX_LOG_WARN, log, "dynamic_balancer: {w}");
            }
            if let Some(what) = &outcome.applied {
                ngx_log_error!(NGX_LOG_INFO, log, "dynamic_balancer: {what}");
            }
            send_json(req, outcome.status as ngx_uint_t, &outcome.body, None)
        }
        Some(WriteOutcome::Unreadable(e)) => {
            error(req, INTERNAL_ERROR, &format!("cannot read the request body: {e}"), None)
        }
    }
}

/// Answers a refused store write (404 or 507).
fn store_error(req: &mut Request, e: &StoreError, name: &str) -> ngx_int_t {
    match e {
        StoreError::NotFound | StoreError::Superseded => {
            error(req, NOT_FOUND, &format!("no backend named {name:?}"), None)
        }
        StoreError::ZoneFull { needed, zone } => {
            let msg = format!(
                "dynamic_balancer_zone is full: the change needs {needed} bytes for new backends while the current ones stay in use until it is applied (zone size {zone}); the previous configuration stays in force"
            );
            ngx_log_error!(NGX_LOG_ERR, req.log(), "dynamic_balancer: {msg}");
            error(req, INSUFFICIENT_STORAGE, &msg, None)
        }
    }
}

/// Answers `status` with the API's JSON error body.
fn error(req: &mut Request, status: ngx_uint_t, message: &str, path: Option<&str>) -> ngx_int_t {
    send_json(req, status, &ErrorBody { error: message, path }.to_json(), None)
}

/// Every endpoint of every backend with its shared state.
fn health(zone: &Zone) -> Vec<u8> {
    let now_ms = now_ms();
    let now = now_ms as f64 / 1000.0;
    let table = zone.header().table();
    let index = zone.header().index.read();
    let mut out = Vec::new();
    for blob in index.blobs() {
        let Ok(rt) = RuntimeBackend::decode(blob.runtime()) else {
            continue;
        };
        let slots = table.find_all(rt.endpoints.iter().map(|e| &e.addr));
        for (e, slot) in rt.endpoints.iter().zip(slots) {
            let slot = slot.and_then(|s| s.get());
            out.push(EndpointHealth {
                backend: rt.name.clone(),
                endpoint: e.addr.to_string(),
                down: slot.is_some_and(|s| s.is_down(rt.max_fails, rt.fail_timeout_ms, now_ms)),
                fails: slot.map_or(0, |s| s.fails.load(Ordering::Relaxed)),
                connections: slot.map_or(0, |s| s.conns.load(Ordering::Relaxed)),
                ewma: slot.map_or(0.0, |s| s.score(now)),
                tracked: slot.is_some(),
            });
        }
    }
    drop(index);
    serde_json::to_vec(&serde_json::json!({ "endpoints": out, "tracked": table.live(), "capacity": table.capacity() }))
        .expect("JSON encoding of health")
}

fn status(zone: &Zone, state_file: Option<&std::path::Path>) -> Vec<u8> {
    let h = zone.header();
    let workers = h
        .workers
        .iter()
        .filter_map(|slot| {
            let pid = slot.pid.load(Ordering::Relaxed);
            (pid != 0).then(|| WorkerStatus {
                pid,
                generation: slot.generation.load(Ordering::Acquire),
            })
        })
        .collect();
    let status = Status {
        generation: h.generation.load(Ordering::Acquire),
        backends: h.backends.load(Ordering::Relaxed),
        endpoints: h.endpoints.load(Ordering::Relaxed),
        zone: ZoneUsage {
            name: "dynamic_balancer".into(),
            size: zone.size() as u64,
            used: zone.used() as u64,
        },
        workers,
        endpoint_table: EndpointTableStatus {
            capacity: h.table().capacity(),
            tracked: h.table().live(),
            untracked: h.untracked.load(Ordering::Relaxed),
            evicted: h.table().evicted(),
            bytes: h.table().bytes(),
        },
        lock_recovered: h.index.recovered(),
        state_file: state_file.map(|path| crate::shm::state_file::status(zone, path)),
    };
    serde_json::to_vec(&status).expect("JSON encoding of status")
}
