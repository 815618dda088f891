//! Runs a request's heavy work (parsing a large POST, formatting a large
//! metrics scrape) off the event loop, on one background thread per worker,
//! then finishes the request back on the event loop.
//!
//! The thread runs at the lowest CPU priority (nice 19), so on a busy machine
//! the event loop, which serves traffic, keeps the CPU and the parse takes the
//! idle time. nginx's thread pools do not fit: an unprivileged worker could
//! lower a pool thread's priority but never restore it, and those threads also
//! serve `aio threads`.
//!
//! Finished jobs are collected by a short timer that is armed only while jobs
//! are in flight. The request is pinned meanwhile exactly as nginx pins a
//! request whose file I/O runs in a thread pool (`ngx_http_copy_filter`,
//! `ngx_http_upstream_thread_handler`): `r->main->blocked` is raised when the
//! job is queued and lowered when it is collected. A blocked request is
//! never freed: if the client goes away, a body turns out broken, or
//! `worker_shutdown_timeout` fires while the job is queued, nginx's
//! `ngx_http_terminate_request` only marks it and waits. When the job comes
//! back to a terminated request, its answer is dropped and the connection's
//! handler finishes the termination.
//!
//! How a terminated request is recognised: while the job is queued the
//! request's write handler is [`awaiting_offload`], and a termination of a
//! blocked request replaces it with nginx's finalizer. This works on every
//! nginx the module builds for; `r->main->terminated`, which says the same,
//! only exists since nginx 1.25.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, Sender};

use ngx::ffi::{
    ngx_event_t, ngx_http_finalize_request, ngx_http_request_empty_handler, ngx_http_request_t,
    ngx_http_run_posted_requests, ngx_int_t, NGX_LOG_WARN,
};
use ngx::http::Request;
use ngx::ngx_log_error;

use crate::nginx::guard::ffi_guard;
use crate::nginx::worker::{self, WorkerTimer};

/// How often the event loop collects finished jobs while any are pending, ms.
const POLL_MS: usize = 2;

/// Finishes a request on the event loop: only [`offload`] and [`on_poll`]
/// call one, with the request it was made for, live and unpinned again.
type Finish = Box<dyn FnOnce(*mut ngx_http_request_t) + Send>;

/// A request pointer carried to the thread and back. The thread never
/// dereferences it; only the event loop does.
struct RequestPtr(*mut ngx_http_request_t);
// SAFETY: the thread only moves the pointer back through the channel; only
// the event loop, the request's own thread, dereferences it.
unsafe impl Send for RequestPtr {}

struct Job {
    request: RequestPtr,
    run: Box<dyn FnOnce() -> Finish + Send>,
    on_panic: Finish,
}

struct Offloader {
    jobs: Sender<Job>,
    finished: Receiver<(RequestPtr, Finish)>,
}

thread_local! {
    static OFFLOADER: RefCell<Option<Offloader>> = const { RefCell::new(None) };
    static PENDING: Cell<usize> = const { Cell::new(0) };
    static POLL_TIMER: Cell<Option<WorkerTimer>> = const { Cell::new(None) };
}

/// Runs `work(job)` on the background thread, then `done(request, result)`
/// on the event loop, and finalizes the request with the code `done`
/// returns, which releases the reference the caller took; `result` is
/// `None` if `work` panicked. If the thread cannot be started, all of it
/// runs right here. Neither `done` nor the finalize runs if the request was
/// terminated meanwhile.
///
/// It takes the request as a pointer: the pointer crosses to the thread and
/// back, the pin writes `r->main`, which is `r` itself for a main request,
/// and the inline path may free the request before returning, so the caller
/// may hold no reference to it across the call.
///
/// # Safety
/// `r` is a live request that nothing else references during the call, and
/// whose reference (count) the caller took for this call to release.
pub unsafe fn offload<J, R>(
    r: *mut ngx_http_request_t,
    job: J,
    work: fn(J) -> R,
    done: fn(&mut Request, Option<R>) -> ngx_int_t,
) where
    J: Send + 'static,
    R: Send + 'static,
{
    let job = Job {
        request: RequestPtr(r),
        run: Box::new(move || -> Finish {
            let result = work(job);
            // SAFETY: a Finish runs with its live, unpinned request (see
            // `Finish`), which holds the reference `offload`'s caller took.
            Box::new(move |r| unsafe { complete(r, done, Some(result)) })
        }),
        // SAFETY: as above.
        on_panic: Box::new(move |r| unsafe { complete(r, done, None) }),
    };
    // Pin the request before the thread can see it (nginx's thread
    // handlers do the same), so that nothing frees it while queued.
    // SAFETY: `r` is live (this function's contract), and so is its main
    // request; only the event loop, this thread, touches their bit fields.
    unsafe {
        (*(*r).main).set_blocked((*(*r).main).blocked() + 1);
        (*r).set_aio(1);
        (*r).write_event_handler = Some(awaiting_offload);
    }
    let job = match submit(job) {
        Ok(()) => return,
        Err(job) => job,
    };
    // SAFETY: `r` is live, and was pinned just above.
    unsafe { unpin(r) };
    // SAFETY: a live request's connection outlives it.
    let log = unsafe { (*(*r).connection).log };
    ngx_log_error!(NGX_LOG_WARN, log, "dynamic_balancer: no parser thread; parsing inline");
    let finish = catch_unwind(AssertUnwindSafe(job.run)).unwrap_or(job.on_panic);
    finish(r);
}

/// Answers the request with `done`, then finalizes it with the code `done`
/// returns. Keeps the pointer: the finalize may free the request, so no
/// reference to it may be live then.
///
/// # Safety
/// `r` is a live request, on the event loop, that nothing else references
/// during the call, holding the reference (count) this finalize releases.
unsafe fn complete<R>(r: *mut ngx_http_request_t, done: fn(&mut Request, Option<R>) -> ngx_int_t, result: Option<R>) {
    // SAFETY: `r` is live and otherwise unreferenced (this function's
    // contract); `req` ends before the finalize.
    let req = unsafe { Request::from_ngx_http_request(r) };
    let rc = done(req, result);
    // SAFETY: `r` is live (this function's contract) and `req` is no longer
    // used; this finalize releases the reference the offload's caller took.
    unsafe { ngx_http_finalize_request(r, rc) };
}

/// Queues `job` for the thread (starting it on first use) and arms the poll.
fn submit(job: Job) -> Result<(), Job> {
    let sent = OFFLOADER.with_borrow_mut(|slot| {
        if slot.is_none() {
            *slot = start_thread();
        }
        match slot {
            Some(offloader) => offloader.jobs.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    });
    if sent.is_ok() {
        PENDING.set(PENDING.get() + 1);
        arm_poll();
    }
    sent
}

/// The write handler of a request whose job is queued: there is nothing to
/// write until the job comes back. nginx's termination of a blocked request
/// replaces it, which is how `on_poll` knows the answer is not wanted.
unsafe extern "C" fn awaiting_offload(_r: *mut ngx_http_request_t) {
    ffi_guard("offload wait", (), || ());
}

/// Whether `r`'s write handler is still [`awaiting_offload`]. Compared by
/// address: the only other value it can have is nginx's, never ours.
///
/// # Safety
/// `r` is a live request.
unsafe fn awaits_offload(r: *mut ngx_http_request_t) -> bool {
    // SAFETY: `r` is live (this function's contract).
    let handler = unsafe { (*r).write_event_handler };
    let ours = awaiting_offload as unsafe extern "C" fn(*mut ngx_http_request_t);
    handler.map(|f| f as *const () as usize) == Some(ours as *const () as usize)
}

/// Undoes the pin of [`offload`]. Takes a pointer, as `offload` does:
/// `r->main` may be `r` itself, so no reference to `r` may be live while the
/// pin is written.
///
/// # Safety
/// `r` is a live request that `offload` pinned, which nothing else
/// references during the call.
unsafe fn unpin(r: *mut ngx_http_request_t) {
    // SAFETY: `r` is live (this function's contract), and so is its main
    // request; only the event loop, this thread, touches them.
    let main = unsafe { &mut *(*r).main };
    main.set_blocked(main.blocked().saturating_sub(1));
    // SAFETY: as above; `main` (which may be `r` itself) is not used again.
    // A handler that is not ours is a termination's, which must stay.
    unsafe {
        (*r).set_aio(0);
        if awaits_offload(r) {
            (*r).write_event_handler = Some(ngx_http_request_empty_handler);
        }
    }
}

fn start_thread() -> Option<Offloader> {
    let (jobs, inbox) = mpsc::channel::<Job>();
    let (outbox, finished) = mpsc::channel();
    let spawned = std::thread::Builder::new().name("dynbal-parse".into()).spawn(move || {
        worker::block_signals();
        // SAFETY: the priority drop affects this thread alone.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
        for Job { request, run, on_panic } in inbox {
            let finish = catch_unwind(AssertUnwindSafe(run)).unwrap_or(on_panic);
            if outbox.send((request, finish)).is_err() {
                break;
            }
        }
    });
    spawned.ok().map(|_| Offloader { jobs, finished })
}

fn arm_poll() {
    let timer = POLL_TIMER.get().unwrap_or_else(|| {
        // Not cancelable, so a graceful shutdown waits for pending jobs.
        let timer = WorkerTimer::new(Some(on_poll), false);
        POLL_TIMER.set(Some(timer));
        timer
    });
    timer.arm(POLL_MS);
}

/// The poll timer's handler: nginx calls it on the event loop with the
/// worker-owned event `arm_poll` armed; it does not use the event.
unsafe extern "C" fn on_poll(_ev: *mut ngx_event_t) {
    ffi_guard("offload poll", (), || {
        loop {
            let next = OFFLOADER.with_borrow(|o| o.as_ref().and_then(|o| o.finished.try_recv().ok()));
            let Some((RequestPtr(r), finish)) = next else {
                break;
            };
            PENDING.set(PENDING.get().saturating_sub(1));
            // SAFETY: r is alive: it was pinned (blocked) in offload, so no
            // termination could free it.
            let terminated = !unsafe { awaits_offload(r) };
            // SAFETY: r is alive: it was pinned (blocked) in offload, so no
            // termination could free it. Its connection lives in the cycle's
            // connection array, which outlives the request.
            let c = unsafe { (*r).connection };
            // SAFETY: `r` is alive (see above) and `offload` pinned it.
            unsafe { unpin(r) };
            if terminated {
                // Terminated while queued: nobody waits for the answer. The
                // connection's handler runs the termination nginx deferred.
                // SAFETY: the terminated request still holds its connection
                // open, so `c` and its write event are live; running that
                // event's handler is how ngx_http_copy_thread_event_handler
                // hands a deferred termination back to nginx.
                unsafe {
                    if let Some(handler) = (*(*c).write).handler {
                        handler((*c).write);
                    }
                }
                continue;
            }
            if catch_unwind(AssertUnwindSafe(|| finish(r))).is_err() {
                // The request may be left unanswered; keep serving the rest.
                // SAFETY: `c` is in the cycle's connection array, which
                // outlives any request on it.
                let log = unsafe { (*c).log };
                ngx_log_error!(NGX_LOG_WARN, log, "dynamic_balancer: panic while finishing a write");
            }
            // SAFETY: `c` points into the cycle's connection array, valid
            // even if finalizing closed it; ngx_http_run_posted_requests
            // checks `c->destroyed` first, which nginx's own async
            // completions rely on too.
            unsafe { ngx_http_run_posted_requests(c) };
        }
        if PENDING.get() > 0 {
            arm_poll();
        }
    })
}
