//! A request's hold on the Gateway API rule it matched: what the route
//! handler ([`super::gateway`]) leaves for the later hooks of the same
//! request (mirrors, upstream timers, response headers), through an
//! indexed variable that survives internal redirects.

use std::cell::Cell;
use std::rc::Rc;

use lua_compat::routes::matcher::{Compiled, CompiledListener, CompiledRule};
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
    table: Rc<Compiled>,
    listener: *const CompiledListener,
    rule: *const CompiledRule,
    pub mirrors: Cell<MirrorState>,
}

impl Matched {
    /// `listener` must be one of `table`'s, and `rule` one of its.
    pub fn new(table: Rc<Compiled>, listener: &CompiledListener, rule: &CompiledRule) -> Self {
        Matched {
            table,
            listener,
            rule,
            mirrors: Cell::new(MirrorState::NotYet),
        }
    }

    /// The table the request was routed by (backends' TLS is read from it
    /// when nginx connects, whatever table is current by then).
    pub fn table(&self) -> &Rc<Compiled> {
        &self.table
    }

    pub fn listener(&self) -> &CompiledListener {
        // SAFETY: `listener` points into `table` (`new`'s contract), which
        // this value keeps alive.
        unsafe { &*self.listener }
    }

    pub fn rule(&self) -> &CompiledRule {
        // SAFETY: `rule` points into `table` (`new`'s contract), which this
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
