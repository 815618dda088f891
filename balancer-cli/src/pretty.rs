//! `--output json`: the API's JSON as it came, only indented.
//!
//! Going through `serde_json::Value` would sort object keys (the workspace
//! does not enable serde_json's `preserve_order`, and enabling it here
//! would change every other crate's `Value` in a workspace build) and could
//! reformat numbers such as the health's EWMA scores. Re-indenting the text
//! keeps keys, numbers and string escapes byte for byte.

/// Indents valid JSON with two spaces per level (as `serde_json`'s pretty
/// printer does). Text that is not JSON comes back unchanged.
pub fn indent(json: &[u8]) -> String {
    let text = String::from_utf8_lossy(json);
    if serde_json::from_str::<serde::de::IgnoredAny>(&text).is_err() {
        return text.into_owned();
    }
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() * 2);
    let mut depth = 0usize;
    let mut i = 0;
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    };
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'"' => {
                // Copy the string whole, escapes included.
                let start = i;
                i += 1;
                while bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                out.push_str(&text[start..=i]);
            }
            b'{' | b'[' => {
                let close = if c == b'{' { b'}' } else { b']' };
                let next = bytes[i + 1..]
                    .iter()
                    .position(|b| !b.is_ascii_whitespace())
                    .map(|p| i + 1 + p);
                if next.is_some_and(|n| bytes[n] == close) {
                    out.push(c as char);
                    out.push(close as char);
                    i = next.unwrap_or(i);
                } else {
                    out.push(c as char);
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c as char);
            }
            b',' => {
                out.push(',');
                newline(&mut out, depth);
            }
            b':' => out.push_str(": "),
            b' ' | b'\t' | b'\n' | b'\r' => {}
            _ => {
                // A number or a literal: up to the next structural byte.
                let start = i;
                while i + 1 < bytes.len() && !b",:]} \t\r\n".contains(&bytes[i + 1]) {
                    i += 1;
                }
                out.push_str(&text[start..=i]);
            }
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indents_like_serde_json_but_keeps_order_and_numbers() {
        let raw =
            r#"{"zeta":1,"alpha":[{"a":"x\"y,{}:"},[],{}],"e":1.50e-3,"t":true,"n":null,"u":"\u00fc ü"}"#.as_bytes();
        assert_eq!(
            indent(raw),
            "{\n  \"zeta\": 1,\n  \"alpha\": [\n    {\n      \"a\": \"x\\\"y,{}:\"\n    },\n    [],\n    {}\n  ],\n  \"e\": 1.50e-3,\n  \"t\": true,\n  \"n\": null,\n  \"u\": \"\\u00fc ü\"\n}"
        );
        // Same shape as serde_json's pretty printer where order agrees.
        let v: serde_json::Value = serde_json::from_slice(br#"{"a":[1,{"b":[]}],"c":{"d":"e"}}"#).unwrap();
        assert_eq!(
            indent(v.to_string().as_bytes()),
            serde_json::to_string_pretty(&v).unwrap()
        );
        assert_eq!(indent(b" [ 1 , 2 ] "), "[\n  1,\n  2\n]");
        assert_eq!(indent(b"[ ]"), "[]");
        assert_eq!(indent(b"\"s\\\\\""), "\"s\\\\\"");
        assert_eq!(indent(b"42"), "42");
        assert_eq!(indent(b"not json {"), "not json {");
    }
}
