//! `upstream-hash-by` templates, parsed as ingress-nginx's
//! `util.parse_complex_value` parses them and joined as `generate_var_value`
//! joins them, so the key (and so the endpoint) is the same as under Lua.
//!
//! Recognised, left to right: `\$name` (kept literally, backslash included, as
//! Lua does), `${name}`, `$name`, and text. A variable that is not set
//! contributes nothing. A lone backslash matches no rule and is dropped.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyPart {
    Literal(String),
    Variable(String),
}

/// A parsed template.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashKey(pub Vec<KeyPart>);

fn is_name(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

impl HashKey {
    pub fn parse(template: &str) -> HashKey {
        let s = template.as_bytes();
        let mut parts = Vec::new();
        let mut i = 0;
        let name_end = |from: usize| from + s[from..].iter().take_while(|b| is_name(**b)).count();
        while i < s.len() {
            if s[i] == b'\\' && s.get(i + 1) == Some(&b'$') && s.get(i + 2).is_some_and(|b| is_name(*b)) {
                let end = name_end(i + 2);
                parts.push(KeyPart::Literal(template[i..end].to_string()));
                i = end;
            } else if s[i] == b'$' && s.get(i + 1) == Some(&b'{') {
                let end = name_end(i + 2);
                if end > i + 2 && s.get(end) == Some(&b'}') {
                    parts.push(KeyPart::Variable(template[i + 2..end].to_string()));
                    i = end + 1;
                } else {
                    parts.push(KeyPart::Literal("$".into()));
                    i += 1;
                }
            } else if s[i] == b'$' {
                let end = name_end(i + 1);
                if end > i + 1 {
                    parts.push(KeyPart::Variable(template[i + 1..end].to_string()));
                    i = end;
                } else {
                    parts.push(KeyPart::Literal("$".into()));
                    i += 1;
                }
            } else if s[i] == b'\\' {
                i += 1;
            } else {
                let end = i + s[i..].iter().take_while(|b| **b != b'$' && **b != b'\\').count();
                parts.push(KeyPart::Literal(template[i..end].to_string()));
                i = end;
            }
        }
        HashKey(parts)
    }

    /// The key for one request; `lookup` returns a variable's value.
    pub fn render<'a>(&self, mut lookup: impl FnMut(&str) -> Option<&'a [u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        for part in &self.0 {
            match part {
                KeyPart::Literal(text) => out.extend_from_slice(text.as_bytes()),
                KeyPart::Variable(name) => {
                    if let Some(v) = lookup(name) {
                        out.extend_from_slice(v);
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use KeyPart::*;

    #[test]
    fn parses_like_lua() {
        let k = |s: &str| HashKey::parse(s).0;
        assert_eq!(k("$request_uri"), [Variable("request_uri".into())]);
        assert_eq!(
            k("${cookie_id}-$arg_a"),
            [
                Variable("cookie_id".into()),
                Literal("-".into()),
                Variable("arg_a".into())
            ]
        );
        assert_eq!(k("static"), [Literal("static".into())]);
        assert_eq!(k("a$"), [Literal("a".into()), Literal("$".into())]);
        assert_eq!(k("\\$host x"), [Literal("\\$host".into()), Literal(" x".into())]);
        assert_eq!(k("a\\b"), [Literal("a".into()), Literal("b".into())]);
        assert_eq!(k("${bad"), [Literal("$".into()), Literal("{bad".into())]);
    }

    #[test]
    fn renders_with_missing_variables_empty() {
        let key = HashKey::parse("${http_x_user}:$arg_a:$missing");
        let out = key.render(|name| match name {
            "http_x_user" => Some(b"alice"),
            "arg_a" => Some(b"1"),
            _ => None,
        });
        assert_eq!(out, b"alice:1:");
    }
}
