//! Canary routing, rule by rule, in ingress-nginx's order.

use serde_json::{json, Value};
use tests::{backend, primary_with_canary, Nginx, Upstream};

struct Setup {
    ng: Nginx,
    primary: Upstream,
    canary: Upstream,
}

fn policy(weight: i64, extra: Value) -> Value {
    let mut p =
        json!({"weight": weight, "weightTotal": 0, "header": "", "headerValue": "", "headerPattern": "", "cookie": ""});
    for (k, v) in extra.as_object().unwrap() {
        p[k] = v.clone();
    }
    p
}

/// A primary `web` and a canary `web-canary` with `traffic`.
fn setup(traffic: Value) -> Setup {
    let ng = Nginx::builder()
        .location_extra("set $location_path \"/\"; add_header X-Alt $proxy_alternative_upstream_name always;")
        .start();
    let (primary, canary) = (Upstream::start(), Upstream::start());
    assert_eq!(
        ng.post_backends(&primary_with_canary(&primary, &canary, traffic))
            .status,
        201
    );
    Setup { ng, primary, canary }
}

impl Setup {
    fn get(&self, headers: &[(&str, &str)]) -> String {
        let mut all = vec![("X-Backend", "web")];
        all.extend_from_slice(headers);
        self.ng.get_with(&all).body
    }
}

#[test]
fn header_value_routes_only_on_an_exact_match() {
    let s = setup(policy(0, json!({"header": "X-Canary", "headerValue": "yes"})));
    assert_eq!(s.get(&[("X-Canary", "yes")]), s.canary.identity);
    assert_eq!(
        s.get(&[("X-Canary", "always")]),
        s.primary.identity,
        "with a value set, always is just a mismatch"
    );
    assert_eq!(s.get(&[]), s.primary.identity);
    let r = s.ng.get_with(&[("X-Backend", "web"), ("X-Canary", "yes")]);
    assert_eq!(
        r.header("x-alt"),
        Some("web-canary"),
        "$proxy_alternative_upstream_name"
    );
}

#[test]
fn header_pattern_is_a_regex() {
    let s = setup(policy(
        0,
        json!({"header": "X-Canary", "headerPattern": "^(beta|internal)-"}),
    ));
    assert_eq!(s.get(&[("X-Canary", "beta-7")]), s.canary.identity);
    assert_eq!(s.get(&[("X-Canary", "prod-7")]), s.primary.identity);
}

#[test]
fn header_always_and_never() {
    let s = setup(policy(100, json!({"header": "X-Canary"})));
    assert_eq!(s.get(&[("X-Canary", "always")]), s.canary.identity);
    assert_eq!(
        s.get(&[("X-Canary", "never")]),
        s.primary.identity,
        "never beats weight 100"
    );
    assert_eq!(
        s.get(&[("X-Canary", "other")]),
        s.canary.identity,
        "other values fall through to the weight"
    );
}

#[test]
fn header_never_beats_cookie_always_but_other_values_fall_through_to_the_cookie() {
    let s = setup(policy(0, json!({"header": "X-Canary", "cookie": "canary"})));
    assert_eq!(
        s.get(&[("X-Canary", "never"), ("Cookie", "canary=always")]),
        s.primary.identity
    );
    assert_eq!(
        s.get(&[("X-Canary", "maybe"), ("Cookie", "canary=always")]),
        s.canary.identity
    );
}

#[test]
fn cookie_always_and_never() {
    let s = setup(policy(100, json!({"cookie": "canary"})));
    assert_eq!(s.get(&[("Cookie", "canary=never")]), s.primary.identity);
    let s = setup(policy(0, json!({"cookie": "canary"})));
    assert_eq!(s.get(&[("Cookie", "canary=always")]), s.canary.identity);
}

#[test]
fn weight_out_of_100_or_weight_total() {
    let s = setup(policy(100, json!({})));
    assert!((0..10).all(|_| s.get(&[]) == s.canary.identity));
    let s = setup(policy(0, json!({})));
    assert!((0..10).all(|_| s.get(&[]) == s.primary.identity));
    let s = setup(policy(30, json!({})));
    let share = (0..300).filter(|_| s.get(&[]) == s.canary.identity).count() as f64 / 300.0;
    assert!((0.2..=0.4).contains(&share), "weight 30 of 100 gave {share:.2}");
    let s = setup(policy(500, json!({"weightTotal": 1000})));
    let share = (0..300).filter(|_| s.get(&[]) == s.canary.identity).count() as f64 / 300.0;
    assert!((0.4..=0.6).contains(&share), "weight 500 of 1000 gave {share:.2}");
}

fn sticky(b: &mut Value) {
    b["sessionAffinityConfig"] = json!({"name": "cookie", "mode": "persistent",
        "cookieSessionAffinity": {"name": "INGRESSCOOKIE", "locations": {"127.0.0.1": ["/"]}}});
}

#[test]
fn affinity_to_the_primary_wins_then_affinity_to_the_canary() {
    let ng = Nginx::builder().location_extra("set $location_path \"/\";").start();
    let (primary, canary) = (Upstream::start(), Upstream::start());
    let mut p = backend("web", &[primary.endpoint()]);
    p["alternativeBackends"] = json!(["web-canary"]);
    sticky(&mut p);
    let mut c = backend("web-canary", &[canary.endpoint()]);
    c["trafficShapingPolicy"] = policy(0, json!({"header": "X-Canary"}));
    sticky(&mut c);
    assert_eq!(ng.post_backends(&json!([p, c])).status, 201);
    let cookie = |backend: &str, up: &Upstream| {
        format!(
            "INGRESSCOOKIE={}|{}",
            lua_compat::sticky::persistent_key(backend, &format!("127.0.0.1:{}", up.port)),
            lua_compat::sticky::backend_key(backend)
        )
    };
    let primary_cookie = cookie("web", &primary);
    let r = ng.get_with(&[
        ("X-Backend", "web"),
        ("X-Canary", "always"),
        ("Cookie", &primary_cookie),
    ]);
    assert_eq!(r.body, primary.identity, "affinity to the primary beats the header");
    let canary_cookie = cookie("web-canary", &canary);
    let r = ng.get_with(&[("X-Backend", "web"), ("Cookie", &canary_cookie)]);
    assert_eq!(r.body, canary.identity, "affinity to the canary beats weight 0");
}

#[test]
fn every_alternative_is_considered_in_order() {
    let ng = Nginx::builder().start();
    let (primary, first, second) = (Upstream::start(), Upstream::start(), Upstream::start());
    let mut p = backend("web", &[primary.endpoint()]);
    p["alternativeBackends"] = json!(["web-c1", "web-c2"]);
    let mut c1 = backend("web-c1", &[first.endpoint()]);
    c1["trafficShapingPolicy"] = policy(0, json!({"header": "X-C1", "headerValue": "on"}));
    let mut c2 = backend("web-c2", &[second.endpoint()]);
    c2["trafficShapingPolicy"] = policy(0, json!({"header": "X-C2", "headerValue": "on"}));
    assert_eq!(ng.post_backends(&json!([p, c1, c2])).status, 201);
    assert_eq!(
        ng.get_with(&[("X-Backend", "web"), ("X-C2", "on")]).body,
        second.identity
    );
    assert_eq!(
        ng.get_with(&[("X-Backend", "web"), ("X-C1", "on"), ("X-C2", "on")])
            .body,
        first.identity
    );
    assert_eq!(ng.get("web").body, primary.identity);
}

#[test]
fn a_canary_serves_its_requests_when_the_primary_has_no_endpoints() {
    let ng = Nginx::builder().start();
    let canary = Upstream::start();
    let mut p = backend("web", &[]);
    p["alternativeBackends"] = json!(["web-canary"]);
    let mut c = backend("web-canary", &[canary.endpoint()]);
    c["trafficShapingPolicy"] = policy(0, json!({"header": "X-Canary"}));
    assert_eq!(ng.post_backends(&json!([p, c])).status, 201);
    assert_eq!(
        ng.get_with(&[("X-Backend", "web"), ("X-Canary", "always")]).body,
        canary.identity
    );
    assert_eq!(ng.get("web").status, 503, "other requests find no endpoint");
}
