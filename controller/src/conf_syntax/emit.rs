//! Directives written back as nginx syntax, in one canonical form.
//!
//! A word is written bare when it is made only of characters that mean
//! nothing to the tokenizer, otherwise in double quotes with `\`, `"` and
//! the control characters escaped; one directive per line, blocks indented.
//! [`super::parse::parse`] reads the output back into the same directives
//! (a property test checks it), so the text nginx reads has exactly the
//! structure that was judged, whatever the original text looked like.

use std::fmt::Write as _;

use super::Directive;

/// Whether `word` can be written without quotes: nothing in it starts a
/// comment, a string, an escape or a block, or ends a word.
fn bare(word: &str) -> bool {
    !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!$%&()*+,-./:<=>?@[]^_|~".contains(&b))
}

/// `word` as one token of nginx syntax.
pub fn word(word: &str) -> String {
    if bare(word) {
        return word.to_string();
    }
    let mut out = String::with_capacity(word.len() + 2);
    out.push('"');
    for c in word.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `list` as text, one directive per line, each line (the first too)
/// indented by `indent` spaces and blocks by four more; no newline after
/// the last line.
pub fn directives(list: &[Directive], indent: usize) -> String {
    let mut out = String::new();
    write_list(&mut out, list, indent);
    if out.ends_with('\n') {
        out.pop();
    }
    out
}

fn write_list(out: &mut String, list: &[Directive], indent: usize) {
    for d in list {
        let _ = write!(out, "{:indent$}", "");
        for (i, a) in d.args.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(&word(a));
        }
        match &d.block {
            None => out.push_str(";\n"),
            Some(inner) => {
                out.push_str(" {\n");
                write_list(out, inner, indent + 4);
                let _ = writeln!(out, "{:indent$}}}", "");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::parse::{parse, Limits};
    use super::*;

    fn strip_lines(list: &mut [Directive]) {
        for d in list {
            d.line = 0;
            if let Some(b) = &mut d.block {
                strip_lines(b);
            }
        }
    }

    #[test]
    fn hostile_words_are_quoted() {
        assert_eq!(word("add_header"), "add_header");
        assert_eq!(word("$http_host"), "$http_host");
        assert_eq!(word("} } } ssl_engine x;"), "\"} } } ssl_engine x;\"");
        assert_eq!(word("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
        assert_eq!(word(""), "\"\"");
        assert_eq!(word("# not a comment"), "\"# not a comment\"");
        assert_eq!(word("${a}"), "\"${a}\"");
    }

    fn any_word() -> impl Strategy<Value = String> {
        // Every character the tokenizer treats specially, and some others.
        proptest::collection::vec(
            prop_oneof![
                Just('{'),
                Just('}'),
                Just(';'),
                Just('"'),
                Just('\''),
                Just('\\'),
                Just('#'),
                Just('$'),
                Just(' '),
                Just('\n'),
                Just('\t'),
                Just('\r'),
                Just(')'),
                Just('('),
                Just('t'),
                Just('n'),
                Just('é'),
                proptest::char::range('a', 'e'),
            ],
            0..12,
        )
        .prop_map(|cs| cs.into_iter().collect())
    }

    fn any_tree() -> impl Strategy<Value = Vec<Directive>> {
        let leaf = (any_word(), proptest::collection::vec(any_word(), 0..4)).prop_map(|(n, mut rest)| {
            rest.insert(0, if n.is_empty() { "x".into() } else { n });
            Directive {
                args: rest,
                line: 0,
                block: None,
            }
        });
        let node = leaf.prop_recursive(4, 32, 4, |inner| {
            (any_word(), proptest::collection::vec(inner, 0..4)).prop_map(|(n, block)| Directive {
                args: vec![if n.is_empty() { "b".into() } else { n }],
                line: 0,
                block: Some(block),
            })
        });
        proptest::collection::vec(node, 0..5)
    }

    proptest! {
        /// nginx's tokenizer reads the canonical form back into the very
        /// same directives, whatever characters the words hold.
        #[test]
        fn canonical_text_reads_back_the_same(tree in any_tree(), indent in 0usize..16) {
            let text = directives(&tree, indent);
            let mut back = parse(&text, Limits::default()).unwrap();
            strip_lines(&mut back);
            prop_assert_eq!(back, tree);
        }
    }
}
