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

use crate::backends::worker_cache::{self, WorkerBackend};
use crate::nginx::variables;
use crate::shm::zone::Zone;

/// The backend the request goes to, and whether it is a canary.
pub fn route(req: &Request, zone: &Zone, primary: Rc<WorkerBackend>) -> (Rc<WorkerBackend>, bool) {
    if primary.alternatives.is_empty() || is_affinitized(req, &primary) {
        return (primary, false);
    }
    let chosen = {
        let resolved = worker_cache::canaries(zone, &primary);
        let canaries = || resolved.iter().filter_map(std::rc::Weak::upgrade);
        canaries()
            .find(|c| is_affinitized(req, c))
            .or_else(|| canaries().find_map(|c| takes(req, &c).then_some(c)))
    };
    match chosen {
        Some(canary) => (canary, true),
        None => (primary, false),
    }
}

/// Whether `canary`'s header, cookie or weight takes the request. `never`
/// keeps the request off this canary; later ones may still take it.
fn takes(req: &Request, canary: &WorkerBackend) -> bool {
    let policy = &canary.traffic;
    let header = canary.header_variable.as_deref().and_then(|v| variables::get(req, v));
    let cookie = canary.cookie_variable.as_deref().and_then(|v| variables::get(req, v));
    let matches = |_: &str, value: &[u8]| match &canary.header_pattern {
        Some(Ok(re)) => Ok(re.is_match(value)),
        _ => Err(()),
    };
    match policy.header_and_cookie(header, cookie, matches) {
        Verdict::Canary => true,
        Verdict::Primary => false,
        Verdict::Undecided => policy.by_weight(|n| fastrand::u32(1..=n)),
    }
}

/// Whether the request carries `backend`'s sticky cookie: a session stays
/// with the backend (primary or canary) that issued it.
pub(crate) fn is_affinitized(req: &Request, backend: &WorkerBackend) -> bool {
    let Some(sticky) = backend.selector.sticky() else {
        return false;
    };
    let Some(value) = variables::get(req, &sticky.cookie_variable) else {
        return false;
    };
    sticky.is_affinitized(&String::from_utf8_lossy(value))
}
