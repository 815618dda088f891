//! The tables people read: backends, one backend, status, health. Pure
//! functions of the parsed answers, so every layout is tested here.

use lua_compat::algorithm::Algorithm;
use lua_compat::sticky::StickyMode;
use lua_compat::wire::Backend;

use crate::bodies::{Health, Status};
use crate::endpoint_arg;
use crate::table::{columns, fields};

/// How many addresses a row of the backend list shows before `+N more`.
const ADDRESSES_SHOWN: usize = 3;

/// The algorithm that balances `b`, decided as the module decides it
/// (`Algorithm::select`: cookie affinity, then hashing, then
/// `load-balance`), with its parameters.
pub fn algorithm(b: &Backend) -> String {
    let cookie = |mode: &str| {
        let name = &b.session_affinity.cookie.name;
        if name.is_empty() {
            format!("sticky-{mode}")
        } else {
            format!("sticky-{mode} cookie={name}")
        }
    };
    match Algorithm::select(b).0 {
        Algorithm::RoundRobin => "round_robin".into(),
        Algorithm::Ewma => "ewma".into(),
        Algorithm::LeastConn => "least_conn".into(),
        Algorithm::Chash { .. } => format!("chash {}", b.upstream_hash_by.hash_by),
        Algorithm::ChashSubset { subset_size, .. } => {
            format!("chashsubset {} size={subset_size}", b.upstream_hash_by.hash_by)
        }
        Algorithm::Sticky {
            mode: StickyMode::Balanced,
            ..
        } => cookie("balanced"),
        Algorithm::Sticky {
            mode: StickyMode::Persistent,
            ..
        } => cookie("persistent"),
    }
}

/// `get`: one row per backend.
pub fn backends(list: &[Backend]) -> String {
    if list.is_empty() {
        return "no backends\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|b| {
            let mut shown: Vec<String> = b
                .endpoints
                .iter()
                .take(ADDRESSES_SHOWN)
                .map(endpoint_arg::display)
                .collect();
            if b.endpoints.len() > ADDRESSES_SHOWN {
                shown.push(format!("+{} more", b.endpoints.len() - ADDRESSES_SHOWN));
            }
            vec![
                b.name.clone(),
                b.endpoints.len().to_string(),
                algorithm(b),
                if shown.is_empty() { "-".into() } else { shown.join(", ") },
            ]
        })
        .collect();
    columns(&["NAME", "ENDPOINTS", "ALGORITHM", "ADDRESSES"], &rows)
}

/// `get NAME`: the backend's settings, then its endpoints one per line.
pub fn backend(b: &Backend) -> String {
    let mut pairs = vec![
        ("Name", b.name.clone()),
        ("Algorithm", algorithm(b)),
        ("Max fails", b.max_fails.map_or("1 (default)".into(), |n| n.to_string())),
        (
            "Fail timeout",
            b.fail_timeout.map_or("10s (default)".into(), |s| format!("{s}s")),
        ),
    ];
    if b.is_external_name() {
        pairs.push(("Service", "ExternalName (addresses resolved by DNS)".into()));
    }
    if !b.alternative_backends.is_empty() {
        pairs.push(("Canaries", b.alternative_backends.join(", ")));
    }
    if b.no_server {
        pairs.push(("Canary rules", canary_rules(b)));
    }
    let mut out = fields(&pairs);
    out.push('\n');
    if b.endpoints.is_empty() {
        out.push_str("no endpoints (requests for this backend get 503)\n");
    } else {
        let rows: Vec<Vec<String>> = b
            .endpoints
            .iter()
            .map(|e| {
                let mut plain = e.clone();
                plain.weight = None;
                vec![endpoint_arg::display(&plain), e.weight.unwrap_or(1).to_string()]
            })
            .collect();
        out.push_str(&columns(&["ENDPOINT", "WEIGHT"], &rows));
    }
    out
}

/// A canary backend's traffic shaping, in the order the module applies it
/// (header, then cookie, then weight).
fn canary_rules(b: &Backend) -> String {
    let t = &b.traffic_shaping;
    let mut rules = Vec::new();
    if !t.header.is_empty() {
        rules.push(if !t.header_value.is_empty() {
            format!("header {}={}", t.header, t.header_value)
        } else if !t.header_pattern.is_empty() {
            format!("header {}~{}", t.header, t.header_pattern)
        } else {
            format!("header {}", t.header)
        });
    }
    if !t.cookie.is_empty() {
        rules.push(format!("cookie {}", t.cookie));
    }
    if t.weight > 0 {
        let total = if t.weight_total > 0 { t.weight_total } else { 100 };
        rules.push(format!("weight {}/{total}", t.weight));
    }
    if rules.is_empty() {
        "none (takes no traffic)".into()
    } else {
        rules.join(", ")
    }
}

/// `status`: the generation and zone, then each worker and whether it has
/// applied the latest generation.
pub fn status(s: &Status) -> String {
    let pct = if s.zone.size > 0 {
        format!(" ({:.1}%)", s.zone.used as f64 * 100.0 / s.zone.size as f64)
    } else {
        String::new()
    };
    let mut out = fields(&[
        ("Generation", s.generation.to_string()),
        ("Backends", s.backends.to_string()),
        ("Endpoints", s.endpoints.to_string()),
        (
            "Zone",
            format!(
                "{}: {} of {} used{pct}",
                s.zone.name,
                bytes(s.zone.used),
                bytes(s.zone.size)
            ),
        ),
        (
            "Endpoint table",
            format!(
                "{} tracked in {} slots ({}), {} untracked, {} evicted",
                s.endpoint_table.tracked,
                s.endpoint_table.capacity,
                bytes(s.endpoint_table.bytes),
                s.endpoint_table.untracked,
                s.endpoint_table.evicted
            ),
        ),
        ("Lock recovered", s.lock_recovered.to_string()),
        ("State file", state_file(s)),
    ]);
    out.push('\n');
    let rows: Vec<Vec<String>> = s
        .workers
        .iter()
        .map(|w| {
            let state = match s.generation.checked_sub(w.generation) {
                Some(0) => "current".to_string(),
                Some(n) => format!("behind by {n}"),
                None => "ahead (a write in progress)".into(),
            };
            vec![w.pid.to_string(), w.generation.to_string(), state]
        })
        .collect();
    out.push_str(&columns(&["WORKER", "GENERATION", "STATE"], &rows));
    out
}

/// The state file's line: where, how current, and the last failure.
fn state_file(s: &Status) -> String {
    let Some(f) = &s.state_file else {
        return "none (no dynamic_balancer_state)".into();
    };
    let current = if f.generation == 0 {
        "nothing written yet".to_string()
    } else if f.generation == s.generation {
        format!("current (generation {}, written in {} us)", f.generation, f.write_us)
    } else {
        format!("holds generation {} of {}", f.generation, s.generation)
    };
    match &f.error {
        Some(e) => format!("{}: {current}; last write failed: {e}", f.path),
        None => format!("{}: {current}", f.path),
    }
}

/// `health`: the shared per-endpoint state.
pub fn health(h: &Health) -> String {
    let mut out = if h.endpoints.is_empty() {
        "no endpoints\n".to_string()
    } else {
        let rows: Vec<Vec<String>> = h
            .endpoints
            .iter()
            .map(|e| {
                vec![
                    e.backend.clone(),
                    e.endpoint.clone(),
                    if e.tracked == Some(false) {
                        "untracked"
                    } else if e.down {
                        "down"
                    } else {
                        "up"
                    }
                    .into(),
                    e.fails.to_string(),
                    e.connections.to_string(),
                    if e.ewma > 0.0 {
                        format!("{:.1}ms", e.ewma * 1000.0)
                    } else {
                        "-".into()
                    },
                ]
            })
            .collect();
        columns(&["BACKEND", "ENDPOINT", "STATE", "FAILS", "CONNECTIONS", "EWMA"], &rows)
    };
    out.push_str(&format!(
        "\n{} endpoints tracked, table capacity {} (untracked: no room in the zone for their shared state)\n",
        h.tracked, h.capacity
    ));
    out
}

/// Sizes in binary units, one decimal.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bodies::{EndpointHealth, EndpointTable, StateFile, Worker, Zone};

    fn wire(json: serde_json::Value) -> Backend {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn algorithms_as_the_module_picks_them() {
        let b = |extra: serde_json::Value| {
            let mut v = serde_json::json!({"name": "b"});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            algorithm(&wire(v))
        };
        assert_eq!(b(serde_json::json!({})), "round_robin");
        assert_eq!(b(serde_json::json!({"load-balance": "ewma"})), "ewma");
        assert_eq!(b(serde_json::json!({"load-balance": "nope"})), "round_robin");
        assert_eq!(
            b(serde_json::json!({"load-balance": "ewma", "upstreamHashByConfig": {"upstream-hash-by": "$uri"}})),
            "chash $uri"
        );
        assert_eq!(
            b(
                serde_json::json!({"upstreamHashByConfig": {"upstream-hash-by": "$uri", "upstream-hash-by-subset": true}})
            ),
            "chashsubset $uri size=3"
        );
        assert_eq!(
            b(
                serde_json::json!({"sessionAffinityConfig": {"name": "cookie", "mode": "persistent",
                "cookieSessionAffinity": {"name": "SID"}}})
            ),
            "sticky-persistent cookie=SID"
        );
    }

    #[test]
    fn backend_list_and_detail() {
        let list = vec![
            wire(serde_json::json!({"name": "web-80", "endpoints": [
                {"address": "10.0.0.1", "port": "8080", "weight": 5},
                {"address": "::1", "port": "80"}]})),
            wire(
                serde_json::json!({"name": "big", "load-balance": "least_conn", "endpoints": [
                {"address": "10.0.0.1", "port": "1"}, {"address": "10.0.0.2", "port": "1"},
                {"address": "10.0.0.3", "port": "1"}, {"address": "10.0.0.4", "port": "1"},
                {"address": "10.0.0.5", "port": "1"}]}),
            ),
            wire(serde_json::json!({"name": "empty"})),
        ];
        assert_eq!(
            backends(&list),
            "NAME    ENDPOINTS  ALGORITHM    ADDRESSES\n\
             web-80  2          round_robin  10.0.0.1:8080@5, [::1]:80\n\
             big     5          least_conn   10.0.0.1:1, 10.0.0.2:1, 10.0.0.3:1, +2 more\n\
             empty   0          round_robin  -\n"
        );
        assert_eq!(backends(&[]), "no backends\n");
        assert_eq!(
            backend(&list[0]),
            "Name:          web-80\n\
             Algorithm:     round_robin\n\
             Max fails:     1 (default)\n\
             Fail timeout:  10s (default)\n\
             \n\
             ENDPOINT       WEIGHT\n\
             10.0.0.1:8080  5\n\
             [::1]:80       1\n"
        );
        let canary = wire(
            serde_json::json!({"name": "c", "noServer": true, "maxFails": 0, "failTimeout": 3,
            "trafficShapingPolicy": {"weight": 20, "header": "X-Canary", "headerValue": "always"}}),
        );
        let text = backend(&canary);
        assert!(
            text.contains("Canary rules:  header X-Canary=always, weight 20/100\n"),
            "{text}"
        );
        assert!(text.contains("Max fails:     0\nFail timeout:  3s\n"), "{text}");
        assert!(
            text.ends_with("no endpoints (requests for this backend get 503)\n"),
            "{text}"
        );
    }

    #[test]
    fn status_shows_each_worker_against_the_generation() {
        let s = Status {
            generation: 7,
            backends: 2,
            endpoints: 3,
            zone: Zone {
                name: "dynamic_balancer".into(),
                size: 32 << 20,
                used: 1536,
            },
            workers: vec![Worker { pid: 41, generation: 7 }, Worker { pid: 42, generation: 5 }],
            endpoint_table: EndpointTable {
                capacity: 100,
                tracked: 3,
                untracked: 0,
                evicted: 0,
                bytes: 40_000,
            },
            lock_recovered: 0,
            state_file: None,
        };
        assert_eq!(
            status(&s),
            "Generation:      7\n\
             Backends:        2\n\
             Endpoints:       3\n\
             Zone:            dynamic_balancer: 1.5 KiB of 32.0 MiB used (0.0%)\n\
             Endpoint table:  3 tracked in 100 slots (39.1 KiB), 0 untracked, 0 evicted\n\
             Lock recovered:  0\n\
             State file:      none (no dynamic_balancer_state)\n\
             \n\
             WORKER  GENERATION  STATE\n\
             41      7           current\n\
             42      5           behind by 2\n"
        );
    }

    #[test]
    fn status_says_how_current_the_state_file_is() {
        let file = |generation, error: Option<&str>| Status {
            generation: 7,
            state_file: Some(StateFile {
                path: "/var/lib/nginx/b.state".into(),
                generation,
                error: error.map(str::to_string),
                write_us: 1800,
            }),
            ..Status::default()
        };
        let line = |s: String| s.lines().find(|l| l.starts_with("State file:")).unwrap().to_string();
        assert_eq!(
            line(status(&file(7, None))),
            "State file:      /var/lib/nginx/b.state: current (generation 7, written in 1800 us)"
        );
        assert_eq!(
            line(status(&file(5, Some("lock: Permission denied (os error 13)")))),
            "State file:      /var/lib/nginx/b.state: holds generation 5 of 7; last write failed: lock: Permission denied (os error 13)"
        );
        assert_eq!(
            line(status(&file(0, None))),
            "State file:      /var/lib/nginx/b.state: nothing written yet"
        );
    }

    #[test]
    fn health_table() {
        let h = Health {
            endpoints: vec![
                EndpointHealth {
                    backend: "web".into(),
                    endpoint: "127.0.0.1:8080".into(),
                    down: false,
                    fails: 0,
                    connections: 0,
                    ewma: 0.0,
                    tracked: None,
                },
                EndpointHealth {
                    backend: "web".into(),
                    endpoint: "[::1]:80".into(),
                    down: true,
                    fails: 2,
                    connections: 1,
                    ewma: 0.01234,
                    tracked: Some(true),
                },
                EndpointHealth {
                    backend: "big".into(),
                    endpoint: "10.0.0.9:80".into(),
                    tracked: Some(false),
                    ..EndpointHealth::default()
                },
            ],
            tracked: 2,
            capacity: 81920,
        };
        assert_eq!(
            health(&h),
            "BACKEND  ENDPOINT        STATE      FAILS  CONNECTIONS  EWMA\n\
             web      127.0.0.1:8080  up         0      0            -\n\
             web      [::1]:80        down       2      1            12.3ms\n\
             big      10.0.0.9:80     untracked  0      0            -\n\
             \n\
             2 endpoints tracked, table capacity 81920 (untracked: no room in the zone for their shared state)\n"
        );
        assert!(health(&Health::default()).starts_with("no endpoints\n"));
    }

    #[test]
    fn sizes() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(32 << 20), "32.0 MiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }
}
