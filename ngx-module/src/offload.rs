//! Runs a request's heavy work (JSON parsing of a large POST) on nginx's
//! thread pool, so the worker's event loop keeps serving traffic, then
//! finishes the request back on the event loop.
//!
//! The request stays alive meanwhile: the reference that reading its body
//! took is released only when `done` finalizes it.

use std::ffi::c_void;
use std::mem;
use std::panic::{catch_unwind, AssertUnwindSafe};

use ngx::ffi::{
    ngx_cycle, ngx_event_t, ngx_http_request_t, ngx_http_run_posted_requests, ngx_log_t, ngx_str_t,
    ngx_thread_pool_get, ngx_thread_task_alloc, ngx_thread_task_post, NGX_OK,
};

use crate::guard::ffi_guard;

struct Task<J> {
    job: J,
    /// Set when `work` panicked in the thread.
    panicked: bool,
    work: fn(&mut J),
    done: fn(*mut ngx_http_request_t, J, bool),
    request: *mut ngx_http_request_t,
}

/// Runs `work(&mut job)` on thread pool `pool`, then `done(r, job, panicked)`
/// on the event loop. Without a usable pool (nginx built without threads, or a
/// worker shutting down) both run right here.
///
/// # Safety
/// `r` is a live request that the caller keeps referenced until `done`.
pub unsafe fn offload<J: Send + 'static>(
    r: *mut ngx_http_request_t,
    pool: &ngx_str_t,
    job: J,
    work: fn(&mut J),
    done: fn(*mut ngx_http_request_t, J, bool),
) {
    let tp = ngx_thread_pool_get(ngx_cycle, pool as *const _ as *mut _);
    let task = if tp.is_null() {
        std::ptr::null_mut()
    } else {
        ngx_thread_task_alloc((*r).pool, mem::size_of::<Task<J>>())
    };
    if task.is_null() {
        run_inline(r, job, work, done);
        return;
    }
    const { assert!(mem::align_of::<Task<J>>() <= mem::size_of::<usize>()) };
    let ctx = (*task).ctx.cast::<Task<J>>();
    ctx.write(Task {
        job,
        panicked: false,
        work,
        done,
        request: r,
    });
    (*task).handler = Some(run_in_thread::<J>);
    (*task).event.data = ctx.cast();
    (*task).event.handler = Some(complete::<J>);
    if ngx_thread_task_post(tp, task) != NGX_OK as isize {
        let Task { job, .. } = ctx.read();
        run_inline(r, job, work, done);
    }
}

fn run_inline<J>(
    r: *mut ngx_http_request_t,
    mut job: J,
    work: fn(&mut J),
    done: fn(*mut ngx_http_request_t, J, bool),
) {
    let panicked = catch_unwind(AssertUnwindSafe(|| work(&mut job))).is_err();
    done(r, job, panicked);
}

unsafe extern "C" fn run_in_thread<J>(data: *mut c_void, _log: *mut ngx_log_t) {
    // SAFETY: data is the Task written by offload; only this thread touches it
    // until the completion event runs.
    let task = unsafe { &mut *data.cast::<Task<J>>() };
    let work = task.work;
    task.panicked = catch_unwind(AssertUnwindSafe(|| work(&mut task.job))).is_err();
}

unsafe extern "C" fn complete<J>(ev: *mut ngx_event_t) {
    ffi_guard("thread task completion", (), || {
        // SAFETY: event.data is our Task; the thread is done with it, and it is
        // read out exactly once here (the pool memory is freed with the request).
        let Task {
            job,
            panicked,
            done,
            request,
            ..
        } = unsafe { (*ev).data.cast::<Task<J>>().read() };
        let c = unsafe { (*request).connection };
        done(request, job, panicked);
        // SAFETY: as nginx's own thread completions do, run what finalizing posted.
        unsafe { ngx_http_run_posted_requests(c) };
    })
}
