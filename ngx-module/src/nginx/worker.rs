//! The worker process this code runs in, as nginx's globals describe it:
//! whether it is shutting down, and timer events that live as long as it.

use std::ptr::NonNull;

use ngx::ffi::{ngx_add_timer, ngx_event_handler_pt, ngx_event_t, ngx_msec_t};

/// The worker is shutting down (graceful or not) and must not start work
/// or take back shared slots.
pub fn is_leaving() -> bool {
    // SAFETY: plain reads of flags the worker's own signal handling sets,
    // read on the event-loop thread.
    unsafe { ngx::ffi::ngx_exiting != 0 || ngx::ffi::ngx_quit != 0 || ngx::ffi::ngx_terminate != 0 }
}

/// A timer event owned by the worker: allocated once and never freed, since
/// nginx may hold it in its timer tree until the process exits.
#[derive(Clone, Copy)]
pub struct WorkerTimer(NonNull<ngx_event_t>);

impl WorkerTimer {
    /// A new event calling `handler`, logging to the cycle's log.
    /// `cancelable` events do not hold back a graceful shutdown.
    pub fn new(handler: ngx_event_handler_pt, cancelable: bool) -> WorkerTimer {
        // SAFETY: a zeroed ngx_event_t is its valid initial state (as
        // ngx_pcalloc gives nginx's own); the box is leaked on purpose.
        let ev = Box::leak(Box::new(unsafe { std::mem::zeroed::<ngx_event_t>() }));
        ev.handler = handler;
        // SAFETY: ngx_cycle is set before module code runs; its log lives as
        // long as the cycle.
        ev.log = unsafe { (*ngx::ffi::ngx_cycle).log };
        ev.set_cancelable(u32::from(cancelable));
        WorkerTimer(NonNull::from(ev))
    }

    /// Arms the timer to fire in `ms`, unless it already is.
    pub fn arm(self, ms: ngx_msec_t) {
        // SAFETY: the event is ours and alive for the process; nginx's timer
        // functions run on this (the event-loop) thread.
        unsafe {
            if self.0.as_ref().timer_set() == 0 {
                ngx_add_timer(self.0.as_ptr(), ms);
            }
        }
    }
}

/// Blocks every signal on the calling thread: signals are for the event
/// loop, as nginx blocks them in its own threads. For the module's
/// background threads.
pub fn block_signals() {
    // SAFETY: plain libc calls that affect the calling thread only.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
}
