//! GRPCRoutes as the route table's rules.
//!
//! A gRPC call is an HTTP/2 POST to `/<service>/<method>`, so a GRPCRoute
//! is an HTTPRoute whose matches are paths: the module needs nothing new
//! to match one, only to send it to its backend over HTTP/2 (see
//! `lua_compat::routes::BackendProtocol`). Everything else of the two
//! kinds (parent refs, hostnames, header matches, filters, backend refs)
//! has the same shape, so a GRPCRoute is carried through translation and
//! status as an [`HttpRoute`] with its kind beside it ([`Route`]).
//!
//! Method matches become paths as follows (`Exact` is the default type):
//!
//! | match                          | path                                  |
//! |--------------------------------|---------------------------------------|
//! | service and method, `Exact`    | `Exact /service/method`               |
//! | service only, `Exact`          | `PathPrefix /service` (any method)    |
//! | method only, `Exact`           | regex `/[^/]+/method` (escaped)       |
//! | `RegularExpression`            | regex `/(service)/(method)`, `[^/]+` for one left out |
//!
//! The spec orders GRPCRoute matches by the characters of the matching
//! service, then of the method, not by path kind; [`Route::grpc_rank`]
//! gives that, which `precedence` uses in place of the path's rank.

use std::borrow::Cow;

use gateway_api_types::grpcroutes::{GrpcRoute, GrpcRouteRulesMatchesMethod, GrpcRouteRulesMatchesMethodType as T};
use gateway_api_types::httproutes::HttpRoute;
use serde_json::{json, Value};

use super::route::{Route, RouteKind};

impl Route<'static> {
    /// A GRPCRoute in HTTPRoute form, or why it has none (a value the
    /// HTTPRoute schema cannot hold, which the GRPCRoute CRD also forbids).
    pub fn grpc(route: &GrpcRoute) -> Result<Route<'static>, String> {
        let mut doc = serde_json::to_value(route).map_err(|e| e.to_string())?;
        let mut ranks = Vec::new();
        if let Some(rules) = doc.pointer_mut("/spec/rules").and_then(Value::as_array_mut) {
            for (i, rule) in rules.iter_mut().enumerate() {
                let mut rule_ranks = Vec::new();
                let spec_rule = route.spec.rules.as_ref().and_then(|r| r.get(i));
                let matches = spec_rule.and_then(|r| r.matches.as_deref()).unwrap_or_default();
                let mut converted = Vec::new();
                for m in matches {
                    let (path, rank) = method_path(m.method.as_ref());
                    rule_ranks.push(rank);
                    let mut out = json!({"path": path});
                    if let Some(h) = &m.headers {
                        out["headers"] = serde_json::to_value(h).map_err(|e| e.to_string())?;
                    }
                    converted.push(out);
                }
                if matches.is_empty() {
                    rule_ranks.push((0, 0));
                }
                if let Some(obj) = rule.as_object_mut() {
                    if matches.is_empty() {
                        obj.remove("matches");
                    } else {
                        obj.insert("matches".into(), Value::Array(converted));
                    }
                }
                ranks.push(rule_ranks);
            }
        }
        // The status is a GRPCRoute's: read separately, never converted.
        if let Some(obj) = doc.as_object_mut() {
            obj.remove("status");
            obj.insert("kind".into(), json!("HTTPRoute"));
        }
        let http: HttpRoute = serde_json::from_value(doc).map_err(|e| e.to_string())?;
        Ok(Route {
            kind: RouteKind::Grpc,
            http: Cow::Owned(http),
            grpc_ranks: ranks,
        })
    }
}

/// A method match's path match (as HTTPRoute JSON) and its rank.
fn method_path(m: Option<&GrpcRouteRulesMatchesMethod>) -> (Value, (usize, usize)) {
    let service = m.and_then(|m| m.service.as_deref()).filter(|s| !s.is_empty());
    let method = m.and_then(|m| m.method.as_deref()).filter(|s| !s.is_empty());
    let rank = (service.map_or(0, str::len), method.map_or(0, str::len));
    let regex = matches!(m.and_then(|m| m.r#type.as_ref()), Some(T::RegularExpression));
    let path = match (regex, service, method) {
        (false, Some(s), Some(me)) => json!({"type": "Exact", "value": format!("/{s}/{me}")}),
        (false, Some(s), None) => json!({"type": "PathPrefix", "value": format!("/{s}")}),
        (false, None, Some(me)) => json!({
            "type": "RegularExpression",
            "value": format!("/[^/]+/{}", regex::escape(me)),
        }),
        (true, s, me) if s.is_some() || me.is_some() => json!({
            "type": "RegularExpression",
            "value": format!("/(?:{})/(?:{})", s.unwrap_or("[^/]+"), me.unwrap_or("[^/]+")),
        }),
        _ => json!({"type": "PathPrefix", "value": "/"}),
    };
    (path, rank)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_api_types::httproutes::HttpRouteRulesMatchesPathType as P;

    fn grpc(rules: Value) -> GrpcRoute {
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GRPCRoute",
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": {
                "parentRefs": [{"name": "gw"}],
                "hostnames": ["grpc.example.com"],
                "rules": rules,
            },
            "status": {"parents": []},
        }))
        .unwrap()
    }

    fn paths(r: &Route) -> Vec<(Option<P>, String)> {
        r.http
            .spec
            .rules
            .iter()
            .flatten()
            .flat_map(|r| r.matches.iter().flatten())
            .map(|m| {
                let p = m.path.as_ref().unwrap();
                (p.r#type.clone(), p.value.clone().unwrap())
            })
            .collect()
    }

    #[test]
    fn methods_become_paths() {
        let g = grpc(json!([{
            "matches": [
                {"method": {"service": "echo.Echo", "method": "Say"}},
                {"method": {"service": "echo.Echo"}},
                {"method": {"method": "Say.x"}},
                {"method": {"type": "RegularExpression", "service": "echo\\..*", "method": "S.*"}},
                {"method": {"type": "RegularExpression", "method": "S.*"}, "headers": [{"name": "v", "value": "1"}]},
            ],
            "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "a", "value": "b"}]}}],
            "backendRefs": [{"name": "svc", "port": 8080, "weight": 3}],
            "name": "first",
        }]));
        let r = Route::grpc(&g).unwrap();
        assert_eq!(r.kind, RouteKind::Grpc);
        assert_eq!(r.key(), "GRPCRoute/ns/r");
        let p = paths(&r);
        assert!(matches!(p[0].0, Some(P::Exact)));
        assert_eq!(p[0].1, "/echo.Echo/Say");
        assert!(matches!(p[1].0, Some(P::PathPrefix)));
        assert_eq!(p[1].1, "/echo.Echo");
        assert!(matches!(p[2].0, Some(P::RegularExpression)));
        assert_eq!(p[2].1, "/[^/]+/Say\\.x");
        assert_eq!(p[3].1, "/(?:echo\\..*)/(?:S.*)");
        assert_eq!(p[4].1, "/(?:[^/]+)/(?:S.*)");
        let rule = &r.http.spec.rules.as_ref().unwrap()[0];
        assert_eq!(rule.matches.as_ref().unwrap()[4].headers.as_ref().unwrap()[0].name, "v");
        assert_eq!(rule.backend_refs.as_ref().unwrap()[0].weight, Some(3));
        assert_eq!(rule.name.as_deref(), Some("first"));
        assert_eq!(rule.filters.as_ref().unwrap().len(), 1);
        assert_eq!(r.http.spec.hostnames.as_ref().unwrap()[0], "grpc.example.com");
        assert_eq!(r.grpc_rank(0, 0), Some((9, 3)));
        assert_eq!(r.grpc_rank(0, 1), Some((9, 0)));
        assert_eq!(r.grpc_rank(0, 2), Some((0, 5)));
        assert_eq!(Route::http(&r.http).grpc_rank(0, 0), None);
    }

    #[test]
    fn a_rule_without_matches_matches_everything() {
        let r = Route::grpc(&grpc(json!([{"backendRefs": [{"name": "svc", "port": 8080}]}]))).unwrap();
        let rule = &r.http.spec.rules.as_ref().unwrap()[0];
        assert!(rule.matches.is_none());
        assert_eq!(r.grpc_rank(0, 0), Some((0, 0)));
    }
}
