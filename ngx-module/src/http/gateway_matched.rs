//! A request's hold on the Gateway API rule it matched: what the route
//! handler ([`super::gateway`]) leaves for the later hooks of the same
//! request (mirrors, upstream timers, response headers), through an
//! indexed variable that survives internal redirects.

use std::cell::Cell;
use std::rc::Rc;

use lua_compat::routes::matcher::{Compiled, CompiledListener, CompiledRule};
use ngx::ffi::ngx_int_t;
use ngx::http::Request;

use crate::backends::routes_cache::Listener;
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
/// it holds the table (through its listener), so the backend name and the
/// header strings the request points at stay valid even if the table is
/// replaced meanwhile.
pub struct Matched {
    listener: Listener,
    rule: *const CompiledRule,
    pub mirrors: Cell<MirrorState>,
}

impl Matched {
    /// # Safety
    /// `rule` is one of `listener`'s rules.
    pub unsafe fn new(listener: Listener, rule: *const CompiledRule) -> Self {
        Matched {
            listener,
            rule,
            mirrors: Cell::new(MirrorState::NotYet),
        }
    }

    /// The table the request was routed by (backends' TLS is read from it
    /// when nginx connects, whatever table is current by then).
    pub fn table(&self) -> &Rc<Compiled> {
        self.listener.table()
    }

    pub fn listener(&self) -> &CompiledListener {
        self.listener.get()
    }

    pub fn rule(&self) -> &CompiledRule {
        // SAFETY: `rule` is one of the listener's (`new`'s contract), in the
        // table this value holds.
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
