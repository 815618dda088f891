//! The `/configuration` API content handler (`dynamic_balancer_api`).
//!
//! Reads run on the event loop: they copy blobs out of the zone under its read
//! lock. Writes with a body are parsed, validated and applied on a low-priority
//! background thread (see [`crate::offload`]), so a 1 MB POST never stalls
//! traffic.

use std::net::{IpAddr, ToSocketAddrs};
use std::sync::atomic::Ordering;

use lua_compat::api::{
    json_array, route, Action, ErrorBody, Method, RouteError, Status, WorkerStatus, ZoneUsage,
};
use lua_compat::runtime::{prepare_backend, prepare_backends};
use lua_compat::ValidationError;
use ngx::ffi::{
    ngx_http_discard_request_body, ngx_http_finalize_request, ngx_http_read_client_request_body,
    ngx_http_request_t, ngx_int_t, ngx_uint_t, NGX_DONE, NGX_HTTP_DELETE, NGX_HTTP_GET,
    NGX_HTTP_INTERNAL_SERVER_ERROR, NGX_HTTP_POST, NGX_HTTP_PUT, NGX_HTTP_SPECIAL_RESPONSE,
    NGX_LOG_ERR, NGX_LOG_INFO, NGX_OK,
};
use ngx::http::HttpModuleLocationConf;
use ngx::ngx_log_error;

use crate::config::{zone_of, LocConf};
use crate::guard::ffi_guard;
use crate::http::{pool_box, request_body, send_json};
use crate::offload::offload;
use crate::store::{apply, Change, StoreError};
use crate::zone::Zone;
use crate::Module;

const OK: ngx_uint_t = 200;
const CREATED: ngx_uint_t = 201;
const NO_CONTENT: ngx_uint_t = 204;
const BAD_REQUEST: ngx_uint_t = 400;
const NOT_FOUND: ngx_uint_t = 404;
const METHOD_NOT_ALLOWED: ngx_uint_t = 405;
const PAYLOAD_TOO_LARGE: ngx_uint_t = 413;
const INSUFFICIENT_STORAGE: ngx_uint_t = 507;

/// A write waiting for its body: the name for PUT, `None` for POST.
struct PendingWrite {
    put_name: Option<String>,
}

/// The location handler.
pub unsafe extern "C" fn api_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    ffi_guard(
        "api handler",
        NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t,
        || unsafe { handle(r) },
    )
}

unsafe fn handle(r: *mut ngx_http_request_t) -> ngx_int_t {
    let req = &mut *r;
    let Some(zone) = zone_of(req) else {
        return error(r, 500, "dynamic_balancer_zone is not configured", None);
    };
    let method = match req.method as u32 {
        NGX_HTTP_GET => Method::Get,
        NGX_HTTP_POST => Method::Post,
        NGX_HTTP_PUT => Method::Put,
        NGX_HTTP_DELETE => Method::Delete,
        _ => Method::Other,
    };
    let path = String::from_utf8_lossy(req.uri.as_bytes()).into_owned();
    let action = route(method, &path);
    let has_body = matches!(action, Ok(Action::ReplaceBackends | Action::PutBackend(_)));
    if !has_body {
        let rc = ngx_http_discard_request_body(r);
        if rc != NGX_OK as ngx_int_t {
            return rc;
        }
    }
    match action {
        Err(RouteError::NotFound) => error(r, NOT_FOUND, &format!("no route for {path}"), None),
        Err(RouteError::MethodNotAllowed(allow)) => {
            let body = ErrorBody {
                error: &format!("method not allowed; use {allow}"),
                path: None,
            }
            .to_json();
            send_json(r, METHOD_NOT_ALLOWED, &body, Some(allow))
        }
        Ok(Action::ListBackends) => {
            let index = zone.header().index.read();
            let body = json_array(index.blobs().map(|b| b.json()));
            drop(index);
            send_json(r, OK, &body, None)
        }
        Ok(Action::GetBackend(name)) => {
            let index = zone.header().index.read();
            let body = index.find(name.as_bytes()).map(|b| b.json().to_vec());
            drop(index);
            match body {
                Some(body) => send_json(r, OK, &body, None),
                None => error(r, NOT_FOUND, &format!("no backend named {name:?}"), None),
            }
        }
        Ok(Action::Status) => send_json(r, OK, &status(&zone), None),
        Ok(Action::DeleteBackend(name)) => match apply(&zone, Change::Delete(name.to_string())) {
            Ok(applied) => {
                log_write(r, "deleted backend", applied.generation);
                send_json(r, NO_CONTENT, b"", None)
            }
            Err(e) => store_error(r, &e, name),
        },
        Ok(Action::ReplaceBackends | Action::PutBackend(_)) => {
            let put_name = match action {
                Ok(Action::PutBackend(name)) => Some(name.to_string()),
                _ => None,
            };
            start_write(r, PendingWrite { put_name })
        }
    }
}

/// Checks the size and reads the body; the write continues in `body_ready`.
unsafe fn start_write(r: *mut ngx_http_request_t, pending: PendingWrite) -> ngx_int_t {
    let req = &mut *r;
    let max = Module::location_conf(req).map_or(0, |c| c.max_body);
    if max > 0 && req.headers_in.content_length_n > max {
        return too_large(r, max);
    }
    let Some(ctx) = pool_box(req.pool, pending) else {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    *req.ctx.add(crate::module_ctx_index()) = ctx.as_ptr().cast();
    let rc = ngx_http_read_client_request_body(r, Some(body_ready));
    if rc >= NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
        return error(
            r,
            rc as ngx_uint_t,
            "the request body could not be read",
            None,
        );
    }
    NGX_DONE as ngx_int_t
}

unsafe fn too_large(r: *mut ngx_http_request_t, max: i64) -> ngx_int_t {
    let msg = format!("request body is larger than client_max_body_size ({max} bytes)");
    error(r, PAYLOAD_TOO_LARGE, &msg, None)
}

/// What the thread computes from the body.
struct WriteJob {
    zone: Zone,
    put_name: Option<String>,
    body: Vec<u8>,
}

/// What the thread hands back: the PUT name and the outcome.
type WriteOutcome = (Option<String>, Result<(u64, bool), WriteError>);

enum WriteError {
    Invalid(ValidationError),
    Store(StoreError),
}

/// Body read: hand parsing and the store write to the parser thread.
unsafe extern "C" fn body_ready(r: *mut ngx_http_request_t) {
    ffi_guard("request body handler", (), || unsafe {
        let req = &mut *r;
        let pending = &mut *(*req.ctx.add(crate::module_ctx_index())).cast::<PendingWrite>();
        let finish_now = |rc| ngx_http_finalize_request(r, rc);
        let Some(zone) = zone_of(req) else {
            return finish_now(NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
        };
        let body = match request_body(req) {
            Ok(body) => body,
            Err(e) => return finish_now(error(r, 500, &e, None)),
        };
        let max = Module::location_conf(req).map_or(0, |c: &LocConf| c.max_body);
        if max > 0 && body.len() as i64 > max {
            // A chunked body carries no Content-Length to check up front.
            return finish_now(too_large(r, max));
        }
        let job = WriteJob {
            zone,
            put_name: pending.put_name.take(),
            body,
        };
        offload(r, job, run_write, finish_write);
    })
}

/// On the parser thread: parse, validate, resolve `ExternalName`s, store.
fn run_write(job: WriteJob) -> WriteOutcome {
    let mut resolve = |host: &str, port: u16| -> Vec<IpAddr> {
        (host, port)
            .to_socket_addrs()
            .map(|a| a.map(|s| s.ip()).collect())
            .unwrap_or_default()
    };
    let change = match &job.put_name {
        None => prepare_backends(&job.body, &mut resolve).map(Change::ReplaceAll),
        Some(name) => prepare_backend(&job.body, name, &mut resolve).map(Change::Put),
    };
    let outcome = match change {
        Err(e) => Err(WriteError::Invalid(e)),
        Ok(change) => apply(&job.zone, change)
            .map(|a| (a.generation, a.created))
            .map_err(WriteError::Store),
    };
    (job.put_name, outcome)
}

/// Back on the event loop: answer and finalize. `None` means the parser
/// panicked (it was caught; nothing was stored).
fn finish_write(r: *mut ngx_http_request_t, outcome: Option<WriteOutcome>) {
    // SAFETY: r is alive until this finalize (offload's contract).
    unsafe {
        let rc = match outcome {
            None => error(
                r,
                500,
                "internal error while applying the configuration",
                None,
            ),
            Some((put_name, Ok((generation, created)))) => {
                log_write(
                    r,
                    if put_name.is_some() {
                        "stored backend"
                    } else {
                        "replaced all backends"
                    },
                    generation,
                );
                let status = if put_name.is_some() && !created {
                    OK
                } else {
                    CREATED
                };
                send_json(
                    r,
                    status,
                    format!("{{\"generation\":{generation}}}").as_bytes(),
                    None,
                )
            }
            Some((_, Err(WriteError::Invalid(e)))) => {
                error(r, BAD_REQUEST, &e.message, Some(&e.path))
            }
            Some((put_name, Err(WriteError::Store(e)))) => {
                store_error(r, &e, put_name.as_deref().unwrap_or(""))
            }
        };
        ngx_http_finalize_request(r, rc);
    }
}

unsafe fn store_error(r: *mut ngx_http_request_t, e: &StoreError, name: &str) -> ngx_int_t {
    match e {
        StoreError::NotFound => error(r, NOT_FOUND, &format!("no backend named {name:?}"), None),
        StoreError::ZoneFull { needed, zone } => {
            let msg = format!(
                "dynamic_balancer_zone is full: the change needs {needed} bytes for new backends while the current ones stay in use until it is applied (zone size {zone}); the previous configuration stays in force"
            );
            ngx_log_error!(
                NGX_LOG_ERR,
                (*(*r).connection).log,
                "dynamic_balancer: {msg}"
            );
            error(r, INSUFFICIENT_STORAGE, &msg, None)
        }
    }
}

unsafe fn error(
    r: *mut ngx_http_request_t,
    status: ngx_uint_t,
    message: &str,
    path: Option<&str>,
) -> ngx_int_t {
    send_json(
        r,
        status,
        &ErrorBody {
            error: message,
            path,
        }
        .to_json(),
        None,
    )
}

unsafe fn log_write(r: *mut ngx_http_request_t, what: &str, generation: u64) {
    ngx_log_error!(
        NGX_LOG_INFO,
        (*(*r).connection).log,
        "dynamic_balancer: {what}, generation {generation}"
    );
}

fn status(zone: &Zone) -> Vec<u8> {
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
    };
    serde_json::to_vec(&status).expect("JSON encoding of status")
}
