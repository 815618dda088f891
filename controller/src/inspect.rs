//! The inspection commands (`ingress-controller backends|certs|conf|status`),
//! ingress-nginx's kubectl plugin in spirit: run inside the controller's
//! container (`kubectl exec`), they read the module's API (with the token
//! in `<conf-dir>/api-token`), the controller's `/metrics` and `/readyz`,
//! and the files in the conf dir. Tables for people, `--output json` for
//! scripts. Formatting is pure and tested; fetching is thin.

use std::fmt::Write as _;

use lua_compat::wire::Backend;

/// Left-aligned columns, two spaces apart, as `kubectl get` prints them.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{cell:<w$}  ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// One row per backend: name, algorithm, canary weight, endpoints. The
/// module's answer is read as the wire contract's own type, so the table
/// and the module agree on every field name.
pub fn backends_table(backends: &[Backend]) -> String {
    let rows: Vec<Vec<String>> = backends
        .iter()
        .map(|b| {
            let endpoints: Vec<String> = b
                .endpoints
                .iter()
                .map(|e| match e.address.parse::<std::net::IpAddr>() {
                    Ok(std::net::IpAddr::V6(_)) => format!("[{}]:{}", e.address, e.port.0),
                    _ => format!("{}:{}", e.address, e.port.0),
                })
                .collect();
            let algorithm = if !b.upstream_hash_by.hash_by.is_empty() {
                format!("chash {}", b.upstream_hash_by.hash_by)
            } else if b.load_balance.is_empty() {
                "round_robin".into()
            } else {
                b.load_balance.clone()
            };
            let canary = match b.traffic_shaping.weight {
                w if w > 0 => format!("{w}%"),
                _ => "-".into(),
            };
            vec![
                b.name.clone(),
                algorithm,
                canary,
                endpoints.len().to_string(),
                if endpoints.is_empty() {
                    "-".into()
                } else {
                    endpoints.join(",")
                },
            ]
        })
        .collect();
    table(&["NAME", "ALGORITHM", "CANARY", "N", "ENDPOINTS"], &rows)
}

/// `certs`: what the module holds (never a key), as a table.
pub fn certs_table(certs: &[lua_compat::certificates::CertificateInfo]) -> String {
    let rows: Vec<Vec<String>> = certs
        .iter()
        .map(|c| {
            vec![
                c.id.clone(),
                c.hosts.join(","),
                c.sans.join(","),
                c.not_after.clone(),
                c.sha256.chars().take(16).collect(),
            ]
        })
        .collect();
    table(&["ID", "HOSTS", "SANS", "NOT AFTER", "SHA-256 (PREFIX)"], &rows)
}

/// The `server { ... }` block(s) whose `server_name` names `host`, cut
/// from a rendered nginx.conf by brace depth (the renderer quotes every
/// value, so braces inside strings do not occur unescaped).
pub fn server_blocks(conf: &str, host: &str) -> String {
    let lines: Vec<&str> = conf.lines().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        if trimmed.starts_with("server {") || trimmed == "server{" {
            let mut depth = 0i32;
            let start = i;
            let mut end = i;
            for (j, l) in lines.iter().enumerate().skip(i) {
                depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
                end = j;
                if depth <= 0 {
                    break;
                }
            }
            let block = &lines[start..=end];
            let names = block
                .iter()
                .find(|l| l.trim_start().starts_with("server_name "))
                .map(|l| l.trim().trim_start_matches("server_name").trim_end_matches(';'))
                .unwrap_or("");
            if names.split_whitespace().any(|n| n.trim_matches('"') == host) {
                out.push_str(&block.join("\n"));
                out.push('\n');
            }
            i = end + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// Selected counters from the controller's OpenMetrics text.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (key, value) = l.rsplit_once(' ')?;
        let bare = key.split('{').next()?;
        (bare == name).then(|| value.parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_columns() {
        let t = table(
            &["NAME", "N"],
            &[vec!["a".into(), "1".into()], vec!["longer".into(), "22".into()]],
        );
        assert_eq!(t, "NAME    N\na       1\nlonger  22\n");
    }

    #[test]
    fn backends_show_algorithm_canary_and_endpoints() {
        let b: Vec<Backend> = serde_json::from_value(json!([
            {"name": "ns-web-80", "endpoints": [{"address": "10.0.0.1", "port": "80"}, {"address": "fd00::1", "port": "80"}]},
            {"name": "ns-c-80", "load-balance": "ewma", "trafficShapingPolicy": {"weight": 20}, "endpoints": []},
            {"name": "ns-h-80", "upstreamHashByConfig": {"upstream-hash-by": "$remote_addr"}, "endpoints": []},
        ]))
        .unwrap();
        let t = backends_table(&b);
        assert!(t.contains("ns-web-80  round_robin"), "{t}");
        assert!(t.contains("10.0.0.1:80,[fd00::1]:80"), "{t}");
        assert!(t.contains("ewma"), "{t}");
        assert!(t.contains("20%"), "{t}");
        assert!(t.contains("chash $remote_addr"), "{t}");
    }

    #[test]
    fn one_host_block_is_cut_from_the_conf() {
        let conf = "http {\n  server {\n    server_name \"a.test\";\n    location / {\n    }\n  }\n  server {\n    server_name \"b.test\";\n  }\n}\n";
        let a = server_blocks(conf, "a.test");
        assert!(
            a.contains("a.test") && a.contains("location /") && !a.contains("b.test"),
            "{a}"
        );
        assert!(server_blocks(conf, "c.test").is_empty());
    }

    #[test]
    fn metrics_are_read_by_name() {
        let text = "# HELP x\nfoo_total 3\nbar{a=\"b\"} 2.5\n";
        assert_eq!(metric(text, "foo_total"), Some(3.0));
        assert_eq!(metric(text, "bar"), Some(2.5));
        assert_eq!(metric(text, "baz"), None);
    }
}
