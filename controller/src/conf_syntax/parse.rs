//! The tokenizer and block structure of nginx's configuration files.
//!
//! A faithful port of `ngx_conf_read_token` and the block handling of
//! `ngx_conf_parse` (nginx 1.28, `src/core/ngx_conf_file.c`), including
//! its quirks, because what matters is that the controller reads a snippet
//! the way nginx would:
//! - `#` starts a comment only where a word could start; inside a word
//!   (`a#b`) it is an ordinary character;
//! - quotes open a string only at the start of a word, and a closed string
//!   must be followed by a space, `;`, `{` or `)`;
//! - `}` ends a block only where a word could start; inside a word
//!   (`200}`) it is an ordinary character;
//! - `\` makes the next character ordinary, whatever it is (a newline, a
//!   quote, a `;`), and `$` followed by `{` keeps the brace in the word;
//! - words are unescaped as nginx does (`\"`, `\'`, `\\`, `\t`, `\r`, `\n`;
//!   any other backslash stays);
//! - a word of 4096 bytes or more ("too long parameter") is refused.
//!
//! The parser is iterative, so a hostile input of a million `{` cannot
//! exhaust the stack; [`Limits::max_depth`] bounds the tree's depth for
//! the recursive walks that follow.

use std::fmt;

use super::Directive;

/// nginx's `NGX_CONF_BUFFER`: no word may reach this many bytes.
pub const NGX_CONF_BUFFER: usize = 4096;

/// Where and why the text is not valid nginx syntax; the message is
/// nginx's own wording where nginx has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (line {})", self.message, self.line)
    }
}

impl std::error::Error for SyntaxError {}

/// Bounds on what one parse may build.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Blocks inside blocks, at most.
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_depth: 64 }
    }
}

/// Parses a whole text (a file, or a snippet read as if it were one) into
/// its directives. A `}` that closes a block the text did not open, and a
/// block the text does not close, are errors, as they are for a file.
pub fn parse(text: &str, limits: Limits) -> Result<Vec<Directive>, SyntaxError> {
    let mut lexer = Lexer {
        text: text.as_bytes(),
        pos: 0,
        line: 1,
    };
    // The blocks being read: the directive that opened each, and what it
    // holds so far. The bottom entry is the text itself.
    let mut open: Vec<(Option<Directive>, Vec<Directive>)> = vec![(None, Vec::new())];
    loop {
        let event = lexer.next_event()?;
        match event {
            Event::Statement(args, line) => {
                let frame = open.last_mut().expect("the text's own frame");
                frame.1.push(Directive {
                    args,
                    line,
                    block: None,
                });
            }
            Event::BlockStart(args, line) => {
                if open.len() > limits.max_depth {
                    return Err(SyntaxError {
                        line,
                        message: format!("blocks nested more than {} deep", limits.max_depth),
                    });
                }
                open.push((
                    Some(Directive {
                        args,
                        line,
                        block: None,
                    }),
                    Vec::new(),
                ));
            }
            Event::BlockDone => {
                if open.len() == 1 {
                    return Err(lexer.error("unexpected \"}\""));
                }
                let (opener, inner) = open.pop().expect("checked above");
                let mut d = opener.expect("only the bottom frame has no opener");
                d.block = Some(inner);
                open.last_mut().expect("the text's own frame").1.push(d);
            }
            Event::Done => {
                if open.len() > 1 {
                    return Err(lexer.error("unexpected end of file, expecting \"}\""));
                }
                return Ok(open.pop().expect("the text's own frame").1);
            }
        }
    }
}

enum Event {
    /// Words ended by `;`, and the line of the first.
    Statement(Vec<String>, usize),
    /// Words ended by `{`.
    BlockStart(Vec<String>, usize),
    /// A `}` where a word could start.
    BlockDone,
    /// The end of the text between statements.
    Done,
}

struct Lexer<'a> {
    text: &'a [u8],
    pos: usize,
    line: usize,
}

fn is_space(ch: u8) -> bool {
    matches!(ch, b' ' | b'\t' | b'\r' | b'\n')
}

impl Lexer<'_> {
    fn error(&self, message: impl Into<String>) -> SyntaxError {
        SyntaxError {
            line: self.line,
            message: message.into(),
        }
    }

    /// One call of `ngx_conf_read_token`: the words of the next statement
    /// and what ended it. The flags are nginx's, with nginx's names.
    fn next_event(&mut self) -> Result<Event, SyntaxError> {
        let mut need_space = false;
        let mut last_space = true;
        let mut sharp_comment = false;
        let mut variable = false;
        let mut quoted = false;
        let mut s_quoted = false;
        let mut d_quoted = false;
        let mut args: Vec<String> = Vec::new();
        let mut first_line = self.line;
        let mut start = self.pos;
        let mut start_line = self.line;

        loop {
            if self.pos >= self.text.len() {
                if !args.is_empty() || !last_space {
                    return Err(self.error("unexpected end of file, expecting \";\" or \"}\""));
                }
                return Ok(Event::Done);
            }
            // nginx refills its 4096-byte buffer from `start`: a word (or
            // a comment) that fills it is refused.
            if self.pos - start >= NGX_CONF_BUFFER {
                self.line = start_line;
                return Err(self.error("too long parameter"));
            }
            let ch = self.text[self.pos];
            self.pos += 1;

            if ch == b'\n' {
                self.line += 1;
                sharp_comment = false;
            }
            if sharp_comment {
                continue;
            }
            if quoted {
                quoted = false;
                continue;
            }
            if need_space {
                if is_space(ch) {
                    last_space = true;
                    need_space = false;
                    continue;
                }
                match ch {
                    b';' => return Ok(Event::Statement(args, first_line)),
                    b'{' => return Ok(Event::BlockStart(args, first_line)),
                    b')' => {
                        last_space = true;
                        need_space = false;
                    }
                    _ => return Err(self.error(format!("unexpected \"{}\"", ch as char))),
                }
            }

            if last_space {
                start = self.pos - 1;
                start_line = self.line;
                if is_space(ch) {
                    continue;
                }
                match ch {
                    b';' | b'{' => {
                        if args.is_empty() {
                            return Err(self.error(format!("unexpected \"{}\"", ch as char)));
                        }
                        return Ok(if ch == b'{' {
                            Event::BlockStart(args, first_line)
                        } else {
                            Event::Statement(args, first_line)
                        });
                    }
                    b'}' => {
                        if !args.is_empty() {
                            return Err(self.error("unexpected \"}\""));
                        }
                        return Ok(Event::BlockDone);
                    }
                    b'#' => {
                        sharp_comment = true;
                        continue;
                    }
                    b'\\' => {
                        quoted = true;
                        last_space = false;
                        continue;
                    }
                    b'"' => {
                        start += 1;
                        d_quoted = true;
                        last_space = false;
                        continue;
                    }
                    b'\'' => {
                        start += 1;
                        s_quoted = true;
                        last_space = false;
                        continue;
                    }
                    b'$' => {
                        variable = true;
                        last_space = false;
                        continue;
                    }
                    _ => last_space = false,
                }
            } else {
                if ch == b'{' && variable {
                    continue;
                }
                variable = false;
                if ch == b'\\' {
                    quoted = true;
                    continue;
                }
                if ch == b'$' {
                    variable = true;
                    continue;
                }
                let mut found = false;
                if d_quoted {
                    if ch == b'"' {
                        d_quoted = false;
                        need_space = true;
                        found = true;
                    }
                } else if s_quoted {
                    if ch == b'\'' {
                        s_quoted = false;
                        need_space = true;
                        found = true;
                    }
                } else if is_space(ch) || ch == b';' || ch == b'{' {
                    last_space = true;
                    found = true;
                }
                if found {
                    if args.is_empty() {
                        first_line = start_line;
                    }
                    args.push(unescape(&self.text[start..self.pos - 1]));
                    if ch == b';' {
                        return Ok(Event::Statement(args, first_line));
                    }
                    if ch == b'{' {
                        return Ok(Event::BlockStart(args, first_line));
                    }
                }
            }
        }
    }
}

/// A word's raw bytes as nginx stores them: `\"`, `\'` and `\\` lose the
/// backslash, `\t`, `\r` and `\n` become the control character, and any
/// other backslash stays.
fn unescape(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'\\' {
            match raw.get(i + 1) {
                Some(b'"' | b'\'' | b'\\') => i += 1,
                Some(b't') => {
                    out.push(b'\t');
                    i += 2;
                    continue;
                }
                Some(b'r') => {
                    out.push(b'\r');
                    i += 2;
                    continue;
                }
                Some(b'n') => {
                    out.push(b'\n');
                    i += 2;
                    continue;
                }
                _ => {}
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    // Words end at ASCII delimiters and unescaping touches ASCII only, so
    // a word of a UTF-8 text is UTF-8.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        Directive::walk(&parse(text, Limits::default()).unwrap(), &mut |d, _| {
            out.push(d.args.clone())
        });
        out
    }

    fn err(text: &str) -> String {
        parse(text, Limits::default()).unwrap_err().message
    }

    fn w(list: &[&[&str]]) -> Vec<Vec<String>> {
        list.iter().map(|d| d.iter().map(|s| s.to_string()).collect()).collect()
    }

    #[test]
    fn statements_blocks_and_comments() {
        assert_eq!(
            words("add_header X-A 1;\n# a comment; with } and {\nlocation /a { return 200; }"),
            w(&[&["add_header", "X-A", "1"], &["location", "/a"], &["return", "200"]])
        );
        let tree = parse("a 1;\nb {\n  c;\n}\n", Limits::default()).unwrap();
        assert_eq!(tree[1].line, 2);
        assert_eq!(tree[1].block.as_ref().unwrap()[0].line, 3);
    }

    #[test]
    fn quotes_escapes_and_variables_as_nginx_reads_them() {
        assert_eq!(
            words(r#"add_header "X A" 'b;}{' "c\"d" e\;f "\t\q";"#),
            w(&[&["add_header", "X A", "b;}{", "c\"d", "e\\;f", "\t\\q"]])
        );
        // `${` keeps the brace in the word; `}` inside a word is a letter.
        assert_eq!(words("set $a ${b}c;"), w(&[&["set", "$a", "${b}c"]]));
        assert_eq!(words("return 200}\n;"), w(&[&["return", "200}"]]));
        // `#` inside a word is a letter; quotes inside a word are letters.
        assert_eq!(words("a b#c d\"e;"), w(&[&["a", "b#c", "d\"e"]]));
        // `)` may follow a closing quote (if conditions).
        assert_eq!(
            words(r#"if ($a = "x") { return 403; }"#),
            w(&[&["if", "($a", "=", "x", ")"], &["return", "403"]])
        );
        // A backslash makes a newline part of the word.
        assert_eq!(words("a b\\\nc;"), w(&[&["a", "b\\\nc"]]));
    }

    #[test]
    fn what_nginx_refuses_is_refused() {
        assert_eq!(err("}"), "unexpected \"}\"");
        assert_eq!(err("a { b; } }"), "unexpected \"}\"");
        assert_eq!(err("a {"), "unexpected end of file, expecting \"}\"");
        assert_eq!(err("a b"), "unexpected end of file, expecting \";\" or \"}\"");
        assert_eq!(err("a \"b;"), "unexpected end of file, expecting \";\" or \"}\"");
        assert_eq!(err("a b\\"), "unexpected end of file, expecting \";\" or \"}\"");
        assert_eq!(err(";"), "unexpected \";\"");
        assert_eq!(err("{"), "unexpected \"{\"");
        assert_eq!(err("a \"b\"c;"), "unexpected \"c\"");
        assert_eq!(err("a b }"), "unexpected \"}\"");
        assert_eq!(err(&format!("a {};", "x".repeat(5000))), "too long parameter");
        // A comment hides what follows it up to the end of the line only.
        assert_eq!(err("a; # }\n}"), "unexpected \"}\"");
    }

    #[test]
    fn a_deep_input_is_refused_without_recursion() {
        let deep = "a {".repeat(1_000_000);
        assert!(err(&deep).contains("nested"));
        let ok = format!("{}{}", "a {".repeat(10), "}".repeat(10));
        assert!(parse(&ok, Limits { max_depth: 10 }).is_ok());
        assert!(parse(&ok, Limits { max_depth: 9 }).is_err());
    }
}
