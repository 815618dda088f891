//! Injection tests: hostile annotation values, hosts and paths must never
//! reach nginx.conf. The payloads follow CVE-2025-1097 (auth-tls-match-cn
//! breaking out of a quoted string) and CVE-2025-1974 (a directive such as
//! `ssl_engine` smuggled in through an annotation and loaded by `nginx -t`).

use std::collections::BTreeMap;

use controller::model::annotations::PREFIX;
use controller::model::catalogue;
use controller::model::{build, BuildOptions};
use controller::render::{RenderContext, Renderer};
use controller::snapshot::Snapshot;
use k8s_openapi::api::networking::v1::Ingress;
use proptest::prelude::*;

/// Every ingress-nginx annotation, supported or not (the catalogue), so a
/// newly supported one is covered the day it lands.
fn keys() -> Vec<&'static str> {
    catalogue::ANNOTATIONS.iter().map(|e| e.name).collect()
}

/// Shapes seen in real exploits, each carrying the marker `pwned`.
const PAYLOADS: &[&str] = &[
    "CN=x\"}}}\n\nssl_engine /tmp/pwned.so;#",
    "CN=(ingress-nginx\\.admission)$\" { } \n ssl_engine pwned; #",
    "http://example.com/#;\n}}}\nssl_engine /proc/self/fd/7; # pwned",
    "/ ; } location /pwned { return 200; } #",
    "1m; pwned on",
    "10.0.0.0/8; allow all; #pwned",
    "https://a.com/\r\nadd_header pwned 1;",
    "$pwned",
    "'pwned'",
    "x.com pwned.com",
    "true\npwned",
    "/app$request_uri#pwned",
    "${pwned}",
    "\\\"; pwned;",
];

fn options() -> BuildOptions {
    let mut o = BuildOptions::default();
    o.class.without_class = true;
    o.listen.address = "127.0.0.1".into();
    o
}

fn ingress(annotations: BTreeMap<String, String>, host: &str, path: &str) -> Ingress {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"namespace": "ns", "name": "ing", "annotations": annotations},
        "spec": {"rules": [{"host": host, "http": {"paths": [
            {"path": path, "pathType": "ImplementationSpecific",
             "backend": {"service": {"name": "svc", "port": {"number": 80}}}},
            {"path": "/ok", "pathType": "Prefix",
             "backend": {"service": {"name": "svc", "port": {"number": 80}}}}
        ]}}]}
    }))
    .unwrap()
}

fn render(ing: Ingress) -> String {
    render_with(ing, None)
}

fn render_with(ing: Ingress, config: Option<BTreeMap<String, String>>) -> String {
    let config_map = config.map(|data| {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ingress-nginx", "name": "ingress-nginx-controller"},
            "data": data,
        }))
        .unwrap()
    });
    let snap = Snapshot {
        ingresses: vec![ing.into()],
        config_map: config_map.map(std::sync::Arc::new),
        ..Default::default()
    };
    let model = build(&snap, &options());
    let ctx = RenderContext {
        module_path: "/m.so".into(),
        pid_file: "/p".into(),
        error_log: "/e".into(),
        error_log_level: "notice".into(),
        access_log: "/a".into(),
        zone_size: "32m".into(),
        default_certificate: "/s/default.pem".into(),
        supervised: true,
        api_token_file: Some("/etc/nginx/api-token".into()),
        metrics: true,
        metrics_per_host: true,
        cpus: 2,
        https_socket: "/h.sock".into(),
        socket_dir: "/".into(),
        auth_dir: "/etc/nginx/auth".into(),
    };
    Renderer::new(None)
        .unwrap()
        .render(model.structure.as_ref().unwrap(), &ctx)
        .unwrap()
}

#[test]
fn exploit_payloads_never_reach_nginx_conf() {
    for payload in PAYLOADS {
        for key in keys() {
            let mut a = BTreeMap::new();
            a.insert(format!("{PREFIX}{key}"), payload.to_string());
            // Keys that only take effect with a companion annotation.
            a.insert(format!("{PREFIX}enable-cors"), "true".into());
            a.insert(format!("{PREFIX}canary"), "false".into());
            a.insert(format!("{PREFIX}use-regex"), "true".into());
            let conf = render(ingress(a, "safe.example.com", "/x"));
            // A domain pair is what proxy-cookie-domain takes: it is
            // rendered as the two tokens it is, and nothing else.
            if key == "proxy-cookie-domain" && *payload == "x.com pwned.com" {
                let lines: Vec<&str> = conf.lines().filter(|l| l.contains("pwned")).collect();
                assert!(
                    !lines.is_empty() && lines.iter().all(|l| l.trim() == "proxy_cookie_domain x.com pwned.com;"),
                    "{lines:?}"
                );
                continue;
            }
            assert!(!conf.contains("pwned"), "{key}={payload:?} reached nginx.conf:\n{conf}");
            assert!(!conf.contains("ssl_engine"), "{key}={payload:?}");
        }
        for e in catalogue::CONFIG_MAP.iter().chain(catalogue::CONFIG_MAP_EXTRA) {
            let data = BTreeMap::from([(e.name.to_string(), payload.to_string())]);
            let conf = render_with(ingress(BTreeMap::new(), "safe.example.com", "/x"), Some(data));
            if e.name == "proxy-cookie-domain" && *payload == "x.com pwned.com" {
                assert!(conf.contains("\n    proxy_cookie_domain x.com pwned.com;\n"));
                continue;
            }
            // Free text (a user agent or referer to block) is data: one
            // quoted token, nothing else on the line it could reach.
            let quoted = format!("\"{payload}\"");
            let as_data = |l: &str| l.trim() == format!("{quoted} 1;");
            // A log format is text (JSON has braces and quotes): it must be
            // the one quoted token of log_format, quotes and `\` escaped.
            if e.name == "log-format-upstream" {
                let escaped = payload.replace('\\', "\\\\").replace('"', "\\\"");
                let line = format!("log_format upstreaminfo \"{escaped}\";");
                assert!(
                    conf.lines()
                        .filter(|l| l.contains("pwned") || l.contains("ssl_engine"))
                        .all(|l| l.trim() == line),
                    "ConfigMap log-format-upstream={payload:?} reached nginx.conf"
                );
                continue;
            }
            if !payload.contains(['"', '\\', ';', '{', '}', '#', '$', '\n', '\r'])
                && conf.lines().filter(|l| l.contains("pwned")).all(as_data)
            {
                continue;
            }
            assert!(
                !conf.contains("pwned"),
                "ConfigMap {}={payload:?} reached nginx.conf",
                e.name
            );
            assert!(!conf.contains("ssl_engine"), "ConfigMap {}={payload:?}", e.name);
        }
        let conf = render(ingress(BTreeMap::new(), payload, "/x"));
        assert!(!conf.contains("pwned"), "host {payload:?}");
        let conf = render(ingress(BTreeMap::new(), "safe.example.com", &format!("/x{payload}")));
        assert!(!conf.contains("pwned"), "path {payload:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random values built from nginx's syntax characters: whatever the
    /// model accepts, quotes and braces outside quotes stay balanced in the
    /// rendered file, so no value can open or close a block.
    #[test]
    fn random_values_cannot_change_the_directive_structure(
        key in prop::sample::select(keys()),
        value in "[a-z0-9 ;{}#$\"'\\\\\n/.:=,-]{0,24}",
    ) {
        let mut a = BTreeMap::new();
        a.insert(format!("{PREFIX}{key}"), value.clone());
        let conf = render(ingress(a, "safe.example.com", "/x"));
        let structure = |c: &str| {
            let mut counts = [0usize; 2];
            let mut quoted = false;
            let mut escaped = false;
            for ch in c.chars() {
                match ch {
                    _ if escaped => escaped = false,
                    '\\' if quoted => escaped = true,
                    '"' => quoted = !quoted,
                    '{' if !quoted => counts[0] += 1,
                    '}' if !quoted => counts[1] += 1,
                    _ => {}
                }
            }
            prop_assert!(!quoted, "unbalanced quotes for {key}={value:?}");
            Ok(counts)
        };
        let counts = structure(&conf)?;
        prop_assert_eq!(counts[0], counts[1], "unbalanced braces for {}={:?}", key, value);
        // A value can only open a comment by starting a token with `#`,
        // and `#` is never written bare.
        prop_assert!(!conf.contains(" #pwned"), "{}", key);
    }
}
