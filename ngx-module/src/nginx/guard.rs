//! No panic may unwind into nginx: every `extern "C"` entry runs its body
//! through [`ffi_guard`], which turns a panic into an error log line and the
//! entry's failure value.

use std::panic::{catch_unwind, AssertUnwindSafe};

use ngx::ffi::{ngx_cycle, NGX_LOG_ALERT};
use ngx::ngx_log_error;

/// Runs `body`; if it panics, logs `what` with the panic message and returns
/// `on_panic` instead.
pub fn ffi_guard<T>(what: &str, on_panic: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("(no message)");
            // SAFETY: ngx_cycle is set before any module code runs and its log
            // lives as long as the cycle.
            let log = unsafe { (*ngx_cycle).log };
            ngx_log_error!(NGX_LOG_ALERT, log, "dynamic_balancer: panic in {what}: {message}");
            on_panic
        }
    }
}
