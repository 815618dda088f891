//! Picks between a backend and its canaries for one request, in the order of
//! ingress-nginx's `route_to_alternative_balancer`: affinity to the primary,
//! then affinity to a canary, then each canary's header, cookie and weight.
//!
//! Beyond Lua, every listed canary is considered in order, not only the first,
//! and a canary with endpoints serves its matching requests even when the
//! primary has none (ingress-nginx answers 503 there).

use std::rc::Rc;

use lua_compat::canary::Verdict;
use ngx::http::Request;

use crate::variables;
use crate::worker_cache::{lookup, WorkerBackend};
use crate::zone::Zone;

/// The backend the request goes to, and whether it is a canary.
pub fn route(req: &Request, zone: &Zone, primary: Rc<WorkerBackend>) -> (Rc<WorkerBackend>, bool) {
    if primary.alternatives.is_empty() || is_affinitized(req, &primary) {
        return (primary, false);
    }
    // Walked twice rather than collected: this runs per request, and a
    // worker-cache lookup is cheaper than a heap allocation.
    let canaries = || {
        primary
            .alternatives
            .iter()
            .filter_map(|name| lookup(zone, name.as_bytes()))
            .filter(|b| !b.endpoints.is_empty())
    };
    if let Some(c) = canaries().find(|c| is_affinitized(req, c)) {
        return (c, true);
    }
    for canary in canaries() {
        let policy = &canary.traffic;
        let header = canary.header_variable.as_deref().and_then(|v| variables::get(req, v));
        let cookie = canary.cookie_variable.as_deref().and_then(|v| variables::get(req, v));
        let matches = |_: &str, value: &[u8]| match &canary.header_pattern {
            Some(Ok(re)) => Ok(re.is_match(value)),
            _ => Err(()),
        };
        match policy.header_and_cookie(header, cookie, matches) {
            Verdict::Canary => return (canary, true),
            // `never` keeps the request off this canary; later ones may still take it.
            Verdict::Primary => continue,
            Verdict::Undecided if policy.by_weight(|n| fastrand::u32(1..=n)) => return (canary, true),
            Verdict::Undecided => {}
        }
    }
    (primary, false)
}

/// Whether the request carries `backend`'s sticky cookie: a session stays
/// with the backend (primary or canary) that issued it.
fn is_affinitized(req: &Request, backend: &WorkerBackend) -> bool {
    let Some(sticky) = backend.selector.sticky() else {
        return false;
    };
    let Some(value) = variables::get(req, &sticky.cookie_variable) else {
        return false;
    };
    sticky.is_affinitized(&String::from_utf8_lossy(value))
}
