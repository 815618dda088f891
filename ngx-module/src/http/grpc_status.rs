//! gRPC answers from the route handler itself.
//!
//! A gRPC client reads errors from the `grpc-status` of a response, not
//! from its HTTP status: an nginx error page (HTML with a 404) is a
//! protocol error to most clients. So a gRPC call that no route takes, or
//! whose rule has no usable backend, gets a Trailers-Only response: HTTP
//! 200, `content-type: application/grpc`, `grpc-status` and
//! `grpc-message`, no body (over HTTP/2 one HEADERS frame that ends the
//! stream). The codes are the GRPCRoute spec's `UNIMPLEMENTED` for no
//! match, and `UNAVAILABLE` for no backend.

use std::sync::LazyLock;

use lua_compat::routes::matcher::CompiledHeader;
use ngx::ffi::{
    ngx_http_discard_request_body, ngx_http_send_header, ngx_int_t, ngx_str_t, NGX_HTTP_INTERNAL_SERVER_ERROR,
    NGX_HTTP_OK, NGX_OK,
};
use ngx::http::Request;

use crate::nginx::headers::{self, Side};
use crate::nginx::request::header_in;

/// The answers, each with its status and message.
#[derive(Debug, Clone, Copy)]
pub enum GrpcAnswer {
    /// No route matches the call (`UNIMPLEMENTED`, 12).
    NoRoute,
    /// The matched rule has no usable backend (`UNAVAILABLE`, 14).
    NoBackend,
}

static NO_ROUTE: LazyLock<[CompiledHeader; 2]> = LazyLock::new(|| {
    [
        CompiledHeader::new("grpc-status", "12"),
        CompiledHeader::new("grpc-message", "no route matches the call"),
    ]
});

static NO_BACKEND: LazyLock<[CompiledHeader; 2]> = LazyLock::new(|| {
    [
        CompiledHeader::new("grpc-status", "14"),
        CompiledHeader::new("grpc-message", "the route has no usable backend"),
    ]
});

const CONTENT_TYPE: &[u8] = b"application/grpc";

/// Whether the request is a gRPC call (`content-type: application/grpc`,
/// `application/grpc+proto`, `application/grpc;...`; not gRPC-Web, whose
/// clients read HTTP statuses).
pub fn is_grpc(req: &Request) -> bool {
    header_in(req, b"content-type").is_some_and(|v| {
        v.strip_prefix(CONTENT_TYPE)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"+") || rest.starts_with(b";"))
    })
}

/// Sends `answer` as a Trailers-Only response; the phase handler returns
/// what this returns (nginx finalizes the request with it).
pub fn send(req: &mut Request, answer: GrpcAnswer) -> ngx_int_t {
    // The call's body is never read: discard it, or on HTTP/1.1 it would
    // be taken for the connection's next request.
    // SAFETY: a live request in a phase handler, its body not read yet.
    if unsafe { ngx_http_discard_request_body(req.as_mut()) } != NGX_OK as ngx_int_t {
        req.as_mut().set_keepalive(0);
    }
    let h = match answer {
        GrpcAnswer::NoRoute => &*NO_ROUTE,
        GrpcAnswer::NoBackend => &*NO_BACKEND,
    };
    for header in h {
        // SAFETY: the headers are statics of this worker, alive as long as
        // any request.
        if !unsafe { headers::add(req, Side::Response, header) } {
            return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
        }
    }
    let r = req.as_mut();
    r.headers_out.status = NGX_HTTP_OK as usize;
    r.headers_out.content_type = ngx_str_t {
        len: CONTENT_TYPE.len(),
        data: CONTENT_TYPE.as_ptr().cast_mut(),
    };
    r.headers_out.content_type_len = CONTENT_TYPE.len();
    r.headers_out.content_length_n = 0;
    r.set_header_only(1);
    // SAFETY: a live request in a phase handler, nothing sent yet; the
    // content type is a static.
    unsafe { ngx_http_send_header(r) }
}
