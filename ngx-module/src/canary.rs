//! Picks between a backend and its canaries for one request, in the order of
//! ingress-nginx's `route_to_alternative_balancer`: affinity to the primary,
//! then affinity to a canary, then each canary's header, cookie and weight.
//!
//! Beyond Lua, every listed canary is considered in order, not only the first,
//! and a canary with endpoints serves its matching requests even when the
//! primary has none (ingress-nginx answers 503 there).

use std::rc::Rc;

use lua_compat::canary::Verdict;
use ngx::ffi::ngx_http_request_t;

use crate::variables;
use crate::worker_cache::{lookup, WorkerBackend};
use crate::zone::Zone;

/// The backend the request goes to, and whether it is a canary.
///
/// # Safety
/// `r` is a live request.
pub unsafe fn route(r: *mut ngx_http_request_t, zone: &Zone, primary: Rc<WorkerBackend>) -> (Rc<WorkerBackend>, bool) {
    // SAFETY: `r` is live (this function's contract).
    if primary.alternatives.is_empty() || unsafe { is_affinitized(r, &primary) } {
        return (primary, false);
    }
    let canaries: Vec<Rc<WorkerBackend>> = primary
        .alternatives
        .iter()
        .filter_map(|name| lookup(zone, name.as_bytes()))
        .filter(|b| !b.endpoints.is_empty())
        .collect();
    // SAFETY: `r` is live (this function's contract) while `find` runs.
    if let Some(c) = canaries.iter().find(|c| unsafe { is_affinitized(r, c) }) {
        return (Rc::clone(c), true);
    }
    for canary in &canaries {
        let policy = &canary.traffic;
        // SAFETY: `r` is live (this function's contract); values live in its
        // pool, longer than this function.
        let header = policy.header_variable().and_then(|v| unsafe { variables::get(r, &v) });
        // SAFETY: `r` is live (this function's contract); the value lives in
        // its pool, longer than this function.
        let cookie = policy.cookie_variable().and_then(|v| unsafe { variables::get(r, &v) });
        let matches = |_: &str, value: &[u8]| match &canary.header_pattern {
            Some(Ok(re)) => Ok(re.is_match(value)),
            _ => Err(()),
        };
        match policy.header_and_cookie(header, cookie, matches) {
            Verdict::Canary => return (Rc::clone(canary), true),
            // `never` keeps the request off this canary; later ones may still take it.
            Verdict::Primary => continue,
            Verdict::Undecided if policy.by_weight(|n| fastrand::u32(1..=n)) => return (Rc::clone(canary), true),
            Verdict::Undecided => {}
        }
    }
    (primary, false)
}

/// Whether the request carries `backend`'s sticky cookie: a session stays
/// with the backend (primary or canary) that issued it.
///
/// # Safety
/// `r` is a live request.
unsafe fn is_affinitized(r: *mut ngx_http_request_t, backend: &WorkerBackend) -> bool {
    let Some(sticky) = backend.selector.sticky() else {
        return false;
    };
    // SAFETY: `r` is live (this function's contract); the value lives in its
    // pool and is only read here.
    let Some(value) = (unsafe { variables::get(r, &sticky.cookie_variable) }) else {
        return false;
    };
    sticky.is_affinitized(&String::from_utf8_lossy(value))
}
