//! Re-exports the module's request metrics (`GET /configuration/metrics`,
//! Prometheus text 0.0.4) in the controller's `/metrics` (the same format),
//! with ingress-nginx's constant labels `controller_class`,
//! `controller_namespace` and `controller_pod` added to every sample.
//!
//! The module already leaves out the series of locations the running
//! configuration no longer has (a deleted Ingress), so nothing is filtered
//! here.

use std::fmt::Write;

/// ingress-nginx's constant labels, rendered once.
#[derive(Clone, Debug)]
pub struct ConstLabels(String);

impl ConstLabels {
    pub fn of(identity: &crate::metrics::Identity) -> Self {
        Self::new(&identity.class, &identity.namespace, &identity.pod)
    }

    pub fn new(class: &str, namespace: &str, pod: &str) -> Self {
        let mut s = String::new();
        for (i, (k, v)) in [
            ("controller_class", class),
            ("controller_namespace", namespace),
            ("controller_pod", pod),
        ]
        .into_iter()
        .enumerate()
        {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(s, "{k}=\"");
            for c in v.chars() {
                match c {
                    '\\' => s.push_str("\\\\"),
                    '"' => s.push_str("\\\""),
                    '\n' => s.push_str("\\n"),
                    c => s.push(c),
                }
            }
            s.push('"');
        }
        ConstLabels(s)
    }
}

/// `own` followed by the module's families.
pub fn merge(own: &str, module: &str, labels: &ConstLabels) -> String {
    let mut out = String::with_capacity(own.len() + module.len() + module.len() / 4 + 8);
    out.push_str(own);
    if !own.is_empty() && !own.ends_with('\n') {
        out.push('\n');
    }
    for line in module.lines() {
        relay_line(&mut out, line, labels);
    }
    out
}

fn relay_line(out: &mut String, line: &str, labels: &ConstLabels) {
    if line.is_empty() {
        return;
    }
    if line.starts_with('#') {
        out.push_str(line);
        out.push('\n');
        return;
    }
    // `name{labels} value` or `name value`: the constant labels go first.
    match line.find(['{', ' ']) {
        Some(i) if line.as_bytes()[i] == b'{' => {
            let _ = writeln!(out, "{}{{{},{}", &line[..i], labels.0, &line[i + 1..]);
        }
        Some(i) => {
            let _ = writeln!(out, "{}{{{}}}{}", &line[..i], labels.0, &line[i..]);
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_families_follow_with_constant_labels() {
        let own = "# HELP x_success ok\n# TYPE x_success counter\nx_success 1\n";
        let module = "# HELP nginx_ingress_controller_requests The total number of client requests\n\
            # TYPE nginx_ingress_controller_requests counter\n\
            nginx_ingress_controller_requests{canary=\"\",host=\"a\",method=\"GET\",status=\"200\"} 3\n\
            # TYPE nginx_ingress_controller_nginx_process_requests_total counter\n\
            nginx_ingress_controller_nginx_process_requests_total 9\n\
            # TYPE nginx_ingress_controller_bytes_sent histogram\n";
        let labels = ConstLabels::new("k8s.io/ingress-nginx", "ingress-nginx", "pod-\"1\"");
        let merged = merge(own, module, &labels);
        assert!(merged.starts_with(own));
        assert!(merged.ends_with("# TYPE nginx_ingress_controller_bytes_sent histogram\n"));
        assert!(merged.contains("# TYPE nginx_ingress_controller_requests counter\n"));
        assert!(merged.contains(
            "nginx_ingress_controller_requests{controller_class=\"k8s.io/ingress-nginx\",controller_namespace=\"ingress-nginx\",controller_pod=\"pod-\\\"1\\\"\",canary=\"\",host=\"a\",method=\"GET\",status=\"200\"} 3\n"
        ));
        assert!(merged.contains(
            "nginx_ingress_controller_nginx_process_requests_total{controller_class=\"k8s.io/ingress-nginx\",controller_namespace=\"ingress-nginx\",controller_pod=\"pod-\\\"1\\\"\"} 9\n"
        ));
    }

    #[test]
    fn without_module_text_our_own_output_is_unchanged() {
        let own = "# TYPE a gauge\na 1\n";
        assert_eq!(merge(own, "", &ConstLabels::new("c", "n", "p")), own);
    }
}
