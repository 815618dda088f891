//! The labels a location declares with
//! `dynamic_balancer_metrics namespace=… ingress=… service=… host=… path=…;`.
//!
//! They are literals in nginx.conf, checked and rendered once at
//! configuration time, so a request only picks a cell; nothing a request
//! carries becomes a label value.

use std::fmt;

/// The label names a location may set, in Prometheus' (sorted) order.
pub const KEYS: [&str; 5] = ["host", "ingress", "namespace", "path", "service"];

/// Longest value accepted for `path`; the other labels are Kubernetes names
/// and DNS names, at most 253 bytes.
pub const MAX_PATH: usize = 1024;
pub const MAX_NAME: usize = 253;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocationLabels {
    values: [String; 5],
}

/// Why a `dynamic_balancer_metrics` argument was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelError {
    NotKeyValue(String),
    UnknownKey(String),
    Duplicate(&'static str),
    TooLong(&'static str, usize),
    Control(&'static str),
}

impl fmt::Display for LabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabelError::NotKeyValue(a) => write!(f, "\"{}\" is not key=value", a.escape_debug()),
            LabelError::UnknownKey(k) => write!(
                f,
                "unknown label \"{}\" (expected one of {})",
                k.escape_debug(),
                KEYS.join(", ")
            ),
            LabelError::Duplicate(k) => write!(f, "label \"{k}\" is given twice"),
            LabelError::TooLong(k, max) => write!(f, "label \"{k}\" is longer than {max} bytes"),
            LabelError::Control(k) => write!(f, "label \"{k}\" contains a control character"),
        }
    }
}

impl LocationLabels {
    /// Parses the directive's arguments; labels not given are empty.
    pub fn parse<'a>(args: impl IntoIterator<Item = &'a str>) -> Result<Self, LabelError> {
        let mut labels = LocationLabels::default();
        let mut seen = [false; KEYS.len()];
        for arg in args {
            let (key, value) = arg
                .split_once('=')
                .ok_or_else(|| LabelError::NotKeyValue(arg.to_string()))?;
            let i = KEYS
                .iter()
                .position(|k| *k == key)
                .ok_or_else(|| LabelError::UnknownKey(key.to_string()))?;
            let key = KEYS[i];
            if std::mem::replace(&mut seen[i], true) {
                return Err(LabelError::Duplicate(key));
            }
            let max = if key == "path" { MAX_PATH } else { MAX_NAME };
            if value.len() > max {
                return Err(LabelError::TooLong(key, max));
            }
            if value.chars().any(char::is_control) {
                return Err(LabelError::Control(key));
            }
            labels.values[i] = value.to_string();
        }
        Ok(labels)
    }

    pub fn get(&self, key: &str) -> &str {
        KEYS.iter().position(|k| *k == key).map_or("", |i| &self.values[i])
    }

    /// `host="…",ingress="…",namespace="…",path="…",service="…"`: the
    /// location's part of every series' label text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (i, (k, v)) in KEYS.iter().zip(&self.values).enumerate() {
            if i > 0 {
                out.push(',');
            }
            write_label(&mut out, k, v);
        }
        out
    }
}

/// `name="value"` with the value escaped as the text format requires.
pub fn write_label(out: &mut String, name: &str, value: &str) {
    out.push_str(name);
    out.push_str("=\"");
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The label text of a series: the canary's backend name (empty for the
/// primary, as ingress-nginx's `canary` label) and the location's labels.
pub fn series_text(canary: &str, location: &str) -> String {
    let mut out = String::with_capacity(location.len() + canary.len() + 12);
    write_label(&mut out, "canary", canary);
    out.push(',');
    out.push_str(location);
    out
}

/// A stable 64-bit hash (FNV-1a) of label text, the same in every worker and
/// across reloads, to find a series in the shared table. A collision only
/// costs a byte comparison: entries are matched on the text itself.
pub fn label_hash(text: &[u8]) -> u64 {
    text.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_render_sorted_and_escaped() {
        let l = LocationLabels::parse([
            "namespace=shop",
            "ingress=web",
            "service=api",
            "host=a.example.com",
            r#"path=/x"y\z"#,
        ])
        .unwrap();
        assert_eq!(
            l.render(),
            r#"host="a.example.com",ingress="web",namespace="shop",path="/x\"y\\z",service="api""#
        );
        assert_eq!(l.get("service"), "api");
        assert_eq!(
            series_text("shop-api-canary-80", &l.render()),
            format!(r#"canary="shop-api-canary-80",{}"#, l.render())
        );
    }

    #[test]
    fn missing_labels_are_empty_and_bad_arguments_are_refused() {
        let l = LocationLabels::parse(["ingress=web"]).unwrap();
        assert_eq!(l.render(), r#"host="",ingress="web",namespace="",path="",service="""#);
        assert_eq!(
            LocationLabels::parse(["ingress"]),
            Err(LabelError::NotKeyValue("ingress".into()))
        );
        assert_eq!(
            LocationLabels::parse(["uri=/a"]),
            Err(LabelError::UnknownKey("uri".into()))
        );
        assert_eq!(
            LocationLabels::parse(["host=a", "host=b"]),
            Err(LabelError::Duplicate("host"))
        );
        assert_eq!(LocationLabels::parse(["host=a\nb"]), Err(LabelError::Control("host")));
        let long = format!("path=/{}", "a".repeat(MAX_PATH));
        assert_eq!(
            LocationLabels::parse([long.as_str()]),
            Err(LabelError::TooLong("path", MAX_PATH))
        );
        let name = format!("service={}", "a".repeat(MAX_NAME + 1));
        assert!(LocationLabels::parse([name.as_str()]).is_err());
        // `=` inside a value is the value's.
        assert_eq!(LocationLabels::parse(["path=/a=b"]).unwrap().get("path"), "/a=b");
    }

    #[test]
    fn the_hash_is_fnv1a() {
        assert_eq!(label_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(label_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
