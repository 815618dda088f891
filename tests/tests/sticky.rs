//! Sticky sessions: cookies made exactly as ingress-nginx's Lua makes them
//! keep routing to the same endpoint through the module.

use std::collections::BTreeSet;

use lua_compat::chash::ChashRing;
use lua_compat::sticky::{backend_key, persistent_key};
use serde_json::{json, Value};
use tests::{backend, dead_endpoint, Nginx, Upstream};

fn sticky(name: &str, eps: &[Value], mode: &str, extra: Value) -> Value {
    let mut cookie = json!({"name": "INGRESSCOOKIE", "expires": "172800", "maxage": "172800",
                           "locations": {"127.0.0.1": ["/"]}, "samesite": "Lax"});
    for (k, v) in extra.as_object().unwrap() {
        cookie[k] = v.clone();
    }
    let mut b = backend(name, eps);
    b["sessionAffinityConfig"] = json!({"name": "cookie", "mode": mode, "cookieSessionAffinity": cookie});
    b
}

fn start() -> Nginx {
    Nginx::builder()
        .workers(2)
        .location_extra("set $location_path \"/\";")
        .start()
}

#[test]
fn lua_issued_balanced_cookies_route_to_the_lua_endpoint() {
    let ng = start();
    let ups: Vec<Upstream> = (0..5).map(|_| Upstream::start()).collect();
    let eps: Vec<Value> = ups.iter().map(Upstream::endpoint).collect();
    assert_eq!(
        ng.post_backends(&json!([sticky("shop", &eps, "balanced", json!({}))]))
            .status,
        201
    );
    let ids: Vec<String> = ups.iter().map(|u| format!("127.0.0.1:{}", u.port)).collect();
    let ring = ChashRing::new(ids.iter().map(|id| (id.as_str(), 1)));
    for i in 0..20 {
        // sticky_balanced.lua's key: "<ngx.now()+i>.<worker pid>.<random>".
        let key = format!("17322312{i:02}.123.4711.{}", 1000 + i * 37);
        let want = &ups[ring.find(key.as_bytes()).unwrap().0].identity;
        let cookie = format!("INGRESSCOOKIE={key}|{}", backend_key("shop"));
        for _ in 0..3 {
            let r = ng.get_with(&[("X-Backend", "shop"), ("Cookie", &cookie)]);
            assert_eq!(&r.body, want, "cookie {cookie}");
            assert!(r.header("set-cookie").is_none(), "a known cookie is not re-issued");
        }
    }
}

#[test]
fn lua_issued_persistent_cookies_route_to_the_lua_endpoint() {
    let ng = start();
    let ups: Vec<Upstream> = (0..4).map(|_| Upstream::start()).collect();
    let eps: Vec<Value> = ups.iter().map(Upstream::endpoint).collect();
    assert_eq!(
        ng.post_backends(&json!([sticky("shop", &eps, "persistent", json!({}))]))
            .status,
        201
    );
    for u in &ups {
        let key = persistent_key("shop", &format!("127.0.0.1:{}", u.port));
        let cookie = format!("INGRESSCOOKIE={key}|{}", backend_key("shop"));
        for _ in 0..3 {
            assert_eq!(
                ng.get_with(&[("X-Backend", "shop"), ("Cookie", &cookie)]).body,
                u.identity
            );
        }
    }
}

#[test]
fn a_new_session_gets_the_lua_cookie_and_sticks() {
    let ng = start();
    let ups: Vec<Upstream> = (0..4).map(|_| Upstream::start()).collect();
    let eps: Vec<Value> = ups.iter().map(Upstream::endpoint).collect();
    assert_eq!(
        ng.post_backends(&json!([sticky("shop", &eps, "balanced", json!({}))]))
            .status,
        201
    );
    let first = ng.get("shop");
    let set_cookie = first
        .header("set-cookie")
        .expect("a new session gets a cookie")
        .to_string();
    let value = set_cookie.split(';').next().unwrap().to_string();
    assert!(
        value.starts_with("INGRESSCOOKIE=") && value.ends_with(&format!("|{}", backend_key("shop"))),
        "{set_cookie}"
    );
    // resty.cookie's attribute order, as ingress-nginx sends it.
    let attrs: Vec<&str> = set_cookie
        .split("; ")
        .skip(1)
        .map(|a| a.split('=').next().unwrap())
        .collect();
    assert_eq!(
        attrs,
        ["Expires", "Max-Age", "Path", "HttpOnly", "SameSite"],
        "{set_cookie}"
    );
    assert!(
        set_cookie.contains("; Max-Age=172800; Path=/; HttpOnly; SameSite=Lax"),
        "{set_cookie}"
    );
    let seen: BTreeSet<String> = (0..12)
        .map(|_| ng.get_with(&[("X-Backend", "shop"), ("Cookie", &value)]).body)
        .collect();
    assert_eq!(
        seen,
        BTreeSet::from([first.body.clone()]),
        "the session sticks on both workers"
    );
}

#[test]
fn the_cookie_is_only_issued_on_listed_locations() {
    let ng = start();
    let a = Upstream::start();
    let b = sticky(
        "shop",
        &[a.endpoint()],
        "balanced",
        json!({"locations": {"shop.example.com": ["/"]}}),
    );
    assert_eq!(ng.post_backends(&json!([b])).status, 201);
    let r = ng.get("shop");
    assert_eq!(r.status, 200);
    assert!(r.header("set-cookie").is_none(), "host 127.0.0.1 is not listed");
}

#[test]
fn change_on_failure_moves_the_session_and_reissues_the_cookie() {
    let ng = start();
    let live = Upstream::start();
    let dead = dead_endpoint();
    let dead_id = format!("127.0.0.1:{}", dead["port"].as_str().unwrap());
    let b = sticky(
        "shop",
        &[dead.clone(), live.endpoint()],
        "persistent",
        json!({"change_on_failure": true}),
    );
    assert_eq!(ng.post_backends(&json!([b])).status, 201);
    let cookie = format!(
        "INGRESSCOOKIE={}|{}",
        persistent_key("shop", &dead_id),
        backend_key("shop")
    );
    let r = ng.get_with(&[("X-Backend", "shop"), ("Cookie", &cookie)]);
    assert_eq!(r.body, live.identity, "{:?}", r.headers);
    let reissued = r.header("set-cookie").expect("the moved session gets a new cookie");
    let live_key = persistent_key("shop", &format!("127.0.0.1:{}", live.port));
    assert!(
        reissued.starts_with(&format!("INGRESSCOOKIE={live_key}|")),
        "{reissued}"
    );
}

#[test]
fn without_change_on_failure_a_retry_goes_elsewhere_but_the_cookie_stays() {
    let ng = start();
    let live = Upstream::start();
    let dead = dead_endpoint();
    let dead_id = format!("127.0.0.1:{}", dead["port"].as_str().unwrap());
    // Passive health off, so only the request's own retry is at work.
    let mut b = sticky("shop", &[dead, live.endpoint()], "persistent", json!({}));
    b["maxFails"] = json!(0);
    assert_eq!(ng.post_backends(&json!([b])).status, 201);
    let cookie = format!(
        "INGRESSCOOKIE={}|{}",
        persistent_key("shop", &dead_id),
        backend_key("shop")
    );
    // Lua retries the endpoint that just failed (a 502); the retry here
    // goes to an endpoint the request has not tried.
    let r = ng.get_with(&[("X-Backend", "shop"), ("Cookie", &cookie)]);
    assert_eq!(r.status, 200, "{:?}", r.headers);
    assert_eq!(r.body, live.identity);
    assert_eq!(
        r.header("x-upstream-addr"),
        Some(format!("{dead_id}, 127.0.0.1:{}", live.port).as_str()),
        "the dead endpoint once, then the live one"
    );
    assert_eq!(r.header("set-cookie"), None, "the session keeps its cookie");
}
