//! nginx's configuration syntax, read exactly as nginx reads it.
//!
//! Snippets (`configuration-snippet`, `server-snippet`) are the one place
//! where an Ingress author writes nginx syntax. Before any of it reaches a
//! file nginx reads, the controller parses it with the rules of nginx's own
//! tokenizer ([`parse`], after `ngx_conf_read_token` and `ngx_conf_parse`),
//! judges the resulting directives, and renders them again from the parsed
//! words ([`emit`]) in a canonical form whose only syntax is the one the
//! writer chose. So the text nginx finally reads has the structure the
//! controller judged, even if the author's text was crafted to be read
//! differently: a brace hidden in a comment or a quote cannot survive.
//!
//! [`files`] says which arguments of which directives name files, for the
//! snippet policy and for the check of every rendered configuration.

pub mod emit;
pub mod files;
pub mod parse;

/// One directive as nginx sees it: its words after unescaping (the first is
/// the name), and its block when it opens one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Directive {
    pub args: Vec<String>,
    /// 1-based line of the directive's first word in the parsed text.
    pub line: usize,
    pub block: Option<Vec<Directive>>,
}

impl Directive {
    pub fn name(&self) -> &str {
        self.args.first().map_or("", String::as_str)
    }

    /// Every directive of `list` and of the blocks inside it, depth first,
    /// with the names of the blocks that enclose it (outermost first).
    pub fn walk<'a>(list: &'a [Directive], visit: &mut impl FnMut(&'a Directive, &[&'a str])) {
        fn go<'a>(list: &'a [Directive], outer: &mut Vec<&'a str>, visit: &mut impl FnMut(&'a Directive, &[&'a str])) {
            for d in list {
                visit(d, outer);
                if let Some(block) = &d.block {
                    outer.push(d.name());
                    go(block, outer, visit);
                    outer.pop();
                }
            }
        }
        go(list, &mut Vec::new(), visit)
    }
}
