//! Properties of the wire contract: parsing never panics, whatever arrives,
//! and every valid backend survives the trip through the shared-memory form.

use std::net::IpAddr;

use lua_compat::runtime::{prepare_backends, RuntimeBackend};
use lua_compat::{parse_backends, Backend};
use proptest::prelude::*;
use serde_json::{json, Value};

fn no_dns(_: &str, _: u16) -> Vec<IpAddr> {
    Vec::new()
}

/// Arbitrary JSON, biased toward the shapes the parser looks at.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        "[a-z0-9:.\\-]{0,12}".prop_map(Value::from),
        prop_oneof![Just("name"), Just("endpoints"), Just("port"), Just("address")].prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("name".to_string()),
                    Just("endpoints".to_string()),
                    Just("address".to_string()),
                    Just("port".to_string()),
                    Just("sessionAffinityConfig".to_string()),
                    Just("trafficShapingPolicy".to_string()),
                    "[a-z]{1,6}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn valid_backend() -> impl Strategy<Value = Value> {
    let endpoint = (any::<[u8; 4]>(), 1u16..=65535, any::<bool>()).prop_map(|(ip, port, as_number)| {
        let port = if as_number {
            json!(port)
        } else {
            json!(port.to_string())
        };
        json!({"address": std::net::Ipv4Addr::from(ip).to_string(), "port": port})
    });
    ("[a-z][a-z0-9-]{0,30}", prop::collection::vec(endpoint, 0..20))
        .prop_map(|(name, eps)| json!({"name": name, "endpoints": eps, "load-balance": "round_robin"}))
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse_backends(&bytes);
    }

    #[test]
    fn arbitrary_json_never_panics_and_errors_have_paths(value in any_json()) {
        let text = value.to_string();
        if let Err(e) = parse_backends(text.as_bytes()) {
            prop_assert!(!e.message.is_empty());
        }
    }

    #[test]
    fn valid_backends_round_trip(list in prop::collection::vec(valid_backend(), 0..8)) {
        let mut seen = std::collections::HashSet::new();
        let list: Vec<Value> = list.into_iter().filter(|b| seen.insert(b["name"].as_str().unwrap().to_string())).collect();
        let body = Value::Array(list.clone()).to_string();
        let prepared = prepare_backends(body.as_bytes(), &mut no_dns).unwrap();
        prop_assert_eq!(prepared.len(), list.len());
        for (p, original) in prepared.iter().zip(&list) {
            let rt = RuntimeBackend::decode(&p.runtime).unwrap();
            let wanted: Vec<String> = original["endpoints"].as_array().unwrap().iter()
                .map(|e| format!("{}:{}", e["address"].as_str().unwrap(), e["port"].to_string().trim_matches('"')))
                .collect();
            let got: Vec<String> = rt.endpoints.iter().map(|e| e.addr.to_string()).collect();
            prop_assert_eq!(got, wanted);
            let again: Backend = serde_json::from_slice(&p.json).unwrap();
            prop_assert_eq!(again.name.as_str(), original["name"].as_str().unwrap());
        }
    }
}

#[test]
fn ingress_nginx_example_body_parses() {
    let body = include_str!("../../tests/fixtures/ingress-nginx-backends.json");
    let backends = parse_backends(body.as_bytes()).unwrap();
    assert_eq!(backends.len(), 3);
    assert_eq!(backends[0].alternative_backends, ["shop-web-canary-80"]);
    assert_eq!(backends[0].session_affinity.cookie.name, "INGRESSCOOKIE");
    assert_eq!(backends[1].traffic_shaping.weight, 10);
    assert!(backends[1].no_server);
    assert_eq!(backends[2].endpoints[0].port.0, 8181);
}
