//! Gateway API: what the controller makes of Gateways and HTTPRoutes for
//! the module's route table (`lua_compat::routes`). Pure, like the
//! ingress model: no I/O, unit- and property-tested.
//!
//! - [`hostnames`]: a listener's and a route's hostnames intersected, as
//!   the spec attaches routes to listeners;
//! - [`precedence`]: the order the spec gives matches (hostname, path,
//!   method, headers, query, route age and name, rule order), and the
//!   host groups the module looks requests up in;
//! - [`translate`]: the Gateway objects this controller owns into that
//!   table and the nginx servers it needs;
//! - [`frontend_tls`]: client certificate validation per Gateway port;
//! - [`backend_tls`]: BackendTLSPolicies, and a Gateway's client
//!   certificate for backends;
//! - [`session`]: a rule's session persistence onto sticky backends;
//! - [`listener_sets`]: the ListenerSets a Gateway takes, and whose
//!   listeners a route names;
//! - [`namespaces`]: namespace label selectors;
//! - [`grants`]: what ReferenceGrants allow;
//! - [`services`]: a Service per Gateway, its address;
//! - [`addresses`]: the static addresses a Gateway asks for;
//! - [`condition`]: a status condition before it is written;
//! - [`status`]: the conditions the spec asks for.

pub mod addresses;
pub mod backend_tls;
pub mod condition;
pub mod duration;
pub mod frontend_tls;
pub mod grants;
pub mod grpc;
pub mod hostnames;
pub mod listener_sets;
pub mod namespaces;
pub mod precedence;
pub mod route;
pub mod services;
pub mod session;
pub mod status;
pub mod translate;
