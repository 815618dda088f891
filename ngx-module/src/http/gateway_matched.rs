//! A request's hold on the Gateway API rule it matched: what the route
//! handler ([`super::gateway`]) leaves for the later hooks of the same
//! request (mirrors, upstream timers, response headers), through an
//! indexed variable that survives internal redirects.

use std::cell::Cell;
use std::rc::Rc;

use lua_compat::routes::matcher::{Compiled, CompiledRule};
use ngx::ffi::ngx_int_t;
use ngx::http::Request;

use crate::conf::own_variable;
use crate::nginx::variables::{self, Own};

/// Where a request is with its rule's `RequestMirror`s (see
/// [`super::gateway_mirror`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MirrorState {
    NotYet,
    /// Its body is being read; then copies go to the mirrors whose bits
    /// are set (drawn before the read: a request no mirror takes is not
    /// held for its body).
    Reading(u32),
    /// The copies started; what the mirror handler answers from now on.
    Done(ngx_int_t),
}

/// The rule a request matched, in the request's pool for its whole life:
/// it holds the table, so the backend name and the header strings the
/// request points at stay valid even if the table is replaced meanwhile.
pub struct Matched {
    _table: Rc<Compiled>,
    rule: *const CompiledRule,
    pub mirrors: Cell<MirrorState>,
}

impl Matched {
    /// `rule` must be one of `table`'s.
    pub fn new(table: Rc<Compiled>, rule: &CompiledRule) -> Self {
        Matched {
            _table: table,
            rule,
            mirrors: Cell::new(MirrorState::NotYet),
        }
    }

    pub fn rule(&self) -> &CompiledRule {
        // SAFETY: `rule` points into `_table` (`new`'s contract), which this
        // value keeps alive.
        unsafe { &*self.rule }
    }
}

/// The rule the request matched, if it was routed by one.
pub fn matched(req: &Request) -> Option<&Matched> {
    let p = variables::get_opaque(req, own_variable(req, Own::GatewayRoute)?);
    // SAFETY: only the route handler stores this variable's opaque value: a
    // `Matched` in the request's pool, alive as long as the request.
    unsafe { p.cast::<Matched>().as_ref() }
}
