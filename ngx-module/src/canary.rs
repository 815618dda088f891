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

/// Canaries of a backend looked up without allocating.
const INLINE_CANARIES: usize = 4;

/// The backend the request goes to, and whether it is a canary.
pub fn route(req: &Request, zone: &Zone, primary: Rc<WorkerBackend>) -> (Rc<WorkerBackend>, bool) {
    if primary.alternatives.is_empty() || is_affinitized(req, &primary) {
        return (primary, false);
    }
    // Each canary is looked up once (the rules below walk them twice), into
    // slots on the stack: ingress-nginx gives a backend one canary, and a
    // request should not pay a heap allocation for it.
    let resolve = |name: &String| lookup(zone, name.as_bytes()).filter(|b| !b.endpoints.is_empty());
    let mut inline: [Option<Rc<WorkerBackend>>; INLINE_CANARIES] = Default::default();
    let heap: Vec<Option<Rc<WorkerBackend>>>;
    let resolved: &[Option<Rc<WorkerBackend>>] = if primary.alternatives.len() <= INLINE_CANARIES {
        for (slot, name) in inline.iter_mut().zip(primary.alternatives.iter()) {
            *slot = resolve(name);
        }
        &inline[..primary.alternatives.len()]
    } else {
        heap = primary.alternatives.iter().map(resolve).collect();
        &heap
    };
    let canaries = || resolved.iter().flatten();
    if let Some(c) = canaries().find(|c| is_affinitized(req, c)) {
        return (Rc::clone(c), true);
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
fn is_affinitized(req: &Request, backend: &WorkerBackend) -> bool {
    let Some(sticky) = backend.selector.sticky() else {
        return false;
    };
    let Some(value) = variables::get(req, &sticky.cookie_variable) else {
        return false;
    };
    sticky.is_affinitized(&String::from_utf8_lossy(value))
}
