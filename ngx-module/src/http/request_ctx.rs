//! The module's per-request state and the request's ctx slot that holds it.
//!
//! A request is either proxied through a `dynamic_balancer` upstream (its
//! state is [`PeerData`]) or an API write waiting for its body
//! ([`PendingWrite`]). The slot holds a tagged [`RequestCtx`], so reading it
//! never depends on which kind of location the request is in, and every
//! access goes through the typed accessors below.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;

use lua_compat::tried::TriedSet;
use ngx::ffi::ngx_http_request_t;
use ngx::http::Request;

use crate::backends::worker_cache::WorkerBackend;
use crate::nginx::request::pool_box;

/// What the ctx slot points at.
pub enum RequestCtx {
    Peer(PeerData),
    Write(PendingWrite),
}

/// Per-request balancer state: the backend chosen for the request and its
/// attempts so far.
pub struct PeerData {
    /// Keeps the endpoints (and so `pc->name`, which `$upstream_addr` reads
    /// in the log phase) alive even if a sync replaces the backend.
    pub backend: Rc<WorkerBackend>,
    /// The name the request asked for (the primary, also for a canary).
    /// Points into the request's variables or the location's configuration,
    /// both of which outlive this state (a copy would cost a malloc per request).
    pub requested: (*const u8, usize),
    pub tried: TriedSet,
    /// The request this state belongs to. A pointer, not a borrow: the state
    /// outlives the hook that made it, and nginx hands it back (as
    /// `u->peer.data`) to `peer.get` and `peer.free`, which reach the request
    /// only through it.
    pub request: *mut ngx_http_request_t,
    /// The chash key, rendered once per request.
    pub key: Option<Vec<u8>>,
    /// The endpoint of the attempt in progress.
    pub current: Option<usize>,
    /// The EWMA score of the last pick, for `$balancer_ewma_score`.
    pub ewma_score: Option<f64>,
    /// `init_peer` took this state over from the preaccess phase.
    pub taken: bool,
    /// The request's own copy of its upstream conf, when a Gateway API
    /// rule's timeouts or retries made one
    /// ([`crate::http::gateway_upstream`]): the only conf that may be
    /// written at request time.
    pub own_conf: *mut ngx::ffi::ngx_http_upstream_conf_t,
}

/// An API write waiting for its body.
pub struct PendingWrite {
    /// What the body is for.
    pub target: BodyTarget,
    /// Maintained by [`crate::api::body_limit`].
    pub budget: BodyBudget,
}

/// Which write a body is for.
#[derive(Clone, Debug)]
pub enum BodyTarget {
    /// `POST /configuration/backends`.
    ReplaceBackends,
    /// `PUT /configuration/backends/{name}`.
    PutBackend(String),
    /// `PUT /configuration/certificates/{id}`.
    PutCertificate(String),
    /// `PUT /configuration/servers`.
    PutServers,
    /// `POST /configuration/servers`.
    PostServers,
    /// `PUT /configuration/routes`.
    PutRoutes,
}

/// What the body filter tracks for one API write.
#[derive(Default)]
pub struct BodyBudget {
    pub received: i64,
    pub too_large: bool,
}

/// The slot's current contents.
///
/// # Safety
/// No other reference to the request's state is live while the result is
/// used, and the result does not outlive the request.
unsafe fn slot<'a>(req: &Request) -> Option<&'a mut RequestCtx> {
    // SAFETY: `ctx` has one entry per HTTP module; ours is null or a
    // `RequestCtx` placed by `attach`, which lives as long as the request,
    // outside the request struct. The caller makes the `&mut` unique (this
    // function's contract).
    unsafe {
        (*req.as_ref().ctx.add(crate::nginx::module::http_ctx_index()))
            .cast::<RequestCtx>()
            .as_mut()
    }
}

/// Points the slot at `ctx`.
///
/// # Safety
/// `ctx` lives as long as the request.
unsafe fn attach(req: &Request, ctx: NonNull<RequestCtx>) {
    // SAFETY: a live request's `ctx` is an array outside the request struct,
    // with an entry per HTTP module, ours at our ctx_index. `ctx` outlives
    // the request (this function's contract); a state it replaces stays
    // alive in the pool.
    unsafe { *req.as_ref().ctx.add(crate::nginx::module::http_ctx_index()) = ctx.as_ptr().cast() };
}

/// The balancer state of a proxied request, if it has one.
///
/// # Safety
/// No other reference to the request's state is live while the result is
/// used (`peer.get` and `peer.free` reach the same state through
/// `u->peer.data`), and the result does not outlive the request.
pub unsafe fn peer_data<'a>(req: &Request) -> Option<&'a mut PeerData> {
    // SAFETY: the caller keeps the result unique and within the request's
    // life (this function's contract), which is all `slot` requires.
    match unsafe { slot(req) }? {
        RequestCtx::Peer(p) => Some(p),
        RequestCtx::Write(_) => None,
    }
}

/// The EWMA score of the request's last pick, read without taking the
/// state mutably: `$balancer_ewma_score` may be evaluated while the peer hook
/// renders a hash key or reads a cookie (see `peer::pick`).
///
/// # Safety
/// No mutable reference to the request's state is live during the call.
pub unsafe fn peer_ewma_score(req: &Request) -> Option<f64> {
    // SAFETY: only a shared read of the state, with no `&mut` to it live
    // (this function's contract); the reference ends with the call.
    match unsafe { slot(req) }.map(|c| &*c)? {
        RequestCtx::Peer(p) => p.ewma_score,
        RequestCtx::Write(_) => None,
    }
}

/// The pending write of an API request, if it is one.
///
/// # Safety
/// No other reference to the request's state is live while the result is
/// used, and the result does not outlive the request.
pub unsafe fn pending_write<'a>(req: &Request) -> Option<&'a mut PendingWrite> {
    // SAFETY: the caller keeps the result unique and within the request's
    // life (this function's contract), which is all `slot` requires.
    match unsafe { slot(req) }? {
        RequestCtx::Write(w) => Some(w),
        RequestCtx::Peer(_) => None,
    }
}

/// Stores an API write's state in the request pool and the slot.
pub fn attach_write(req: &Request, pending: PendingWrite) -> Option<NonNull<PendingWrite>> {
    // SAFETY: a live request's pool is live; the value is dropped by the
    // pool's cleanup, after the last access through the slot.
    let mut ctx = unsafe { pool_box(req.as_ref().pool, RequestCtx::Write(pending)) }?;
    // SAFETY: `ctx` lives in the request's pool, as long as the request.
    unsafe { attach(req, ctx) };
    // SAFETY: `ctx` points at the value pool_box just wrote; nothing else
    // borrows it yet.
    match unsafe { ctx.as_mut() } {
        RequestCtx::Write(w) => Some(NonNull::from(w)),
        RequestCtx::Peer(_) => unreachable!("just stored a write"),
    }
}

/// Stores a proxied request's balancer state in the slot, in a box recycled
/// per worker (see [`Recycled`]); the peer hook keeps the returned pointer
/// as `u->peer.data`.
pub fn attach_peer(req: &Request, data: PeerData) -> Option<NonNull<PeerData>> {
    let mut b = RECYCLED
        .with_borrow_mut(|free| free.pop())
        .unwrap_or_else(|| Box::new(None));
    let ctx = NonNull::from(b.insert(RequestCtx::Peer(data)));
    // SAFETY: a live request's pool is live; the pool's cleanup releases the
    // box when the request ends.
    unsafe { pool_box(req.as_ref().pool, Recycled(Some(b))) }?;
    // SAFETY: the box `ctx` points into is released only by the pool
    // cleanup just registered, so it lives as long as the request.
    unsafe { attach(req, ctx) };
    peer_in(ctx)
}

fn peer_in(mut ctx: NonNull<RequestCtx>) -> Option<NonNull<PeerData>> {
    // SAFETY: `attach_peer` passes the live, just-stored value, which
    // nothing else borrows yet.
    match unsafe { ctx.as_mut() } {
        RequestCtx::Peer(p) => Some(NonNull::from(p)),
        RequestCtx::Write(_) => None,
    }
}

/// Proxied requests' state lives in heap boxes recycled per worker, not in
/// the request pool: the pool keeps only a pointer (and its cleanup), so a
/// proxied request allocates no more pool memory than under stock
/// round-robin, and the steady state calls no malloc.
struct Recycled(Option<Box<Option<RequestCtx>>>);

/// Boxes kept for reuse, at most: about one per concurrent request.
const MAX_RECYCLED: usize = 4096;

thread_local! {
    // Boxed on purpose: nginx holds pointers into them, so they must not
    // move when the Vec grows.
    #[allow(clippy::vec_box)]
    static RECYCLED: RefCell<Vec<Box<Option<RequestCtx>>>> = const { RefCell::new(Vec::new()) };
}

impl Drop for Recycled {
    fn drop(&mut self) {
        if let Some(mut b) = self.0.take() {
            // Drops the state (and its hold on the backend) now.
            *b = None;
            RECYCLED.with_borrow_mut(|free| {
                if free.len() < MAX_RECYCLED {
                    free.push(b);
                }
            });
        }
    }
}
