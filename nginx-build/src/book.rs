//! `nginx-build book`: the documentation book (`docs/`), built with mdBook
//! into `build/book`, then every internal link and anchor checked.
//!
//! mdBook comes from crates.io (`cargo install --locked`, a pinned version,
//! without its `serve`/`watch` features) into
//! `${DYNBAL_CACHE:-~/.cache/dynamic-balancer}/tools/mdbook-<version>`, once
//! per machine. A warning from mdBook (an unclosed HTML tag, a missing
//! page) fails the build.
//!
//! The links are checked in the HTML mdBook wrote, not in the Markdown, so
//! the anchors are the ids mdBook really gave its headings (its rules for
//! turning a heading into an id, and for telling repeated ones apart, are
//! its own). mdbook-linkcheck2, the maintained checker, checks files but
//! not anchors.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use scraper::{Html, Selector};

use crate::build::{tool_cache, workspace_root};

const MDBOOK_VERSION: &str = "0.5.4";

/// Builds the book and checks its links; prints where it is.
pub fn run() -> Result<(), String> {
    let root = workspace_root();
    let mdbook = ensure_mdbook()?;
    let out = root.join("build/book");
    let _ = std::fs::remove_dir_all(&out);
    let result = Command::new(&mdbook)
        .arg("build")
        .arg(root.join("docs"))
        .arg("--dest-dir")
        .arg(&out)
        .output()
        .map_err(|e| format!("running {}: {e}", mdbook.display()))?;
    let log = String::from_utf8_lossy(&result.stderr);
    eprint!("{log}");
    if !result.status.success() {
        return Err("mdbook build failed".into());
    }
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    if !warnings.is_empty() {
        return Err(format!("mdbook warned:\n{}", warnings.join("\n")));
    }
    let broken = check_links(&out)?;
    if !broken.is_empty() {
        return Err(format!(
            "{} broken links in the book:\n{}",
            broken.len(),
            broken.join("\n")
        ));
    }
    println!(
        "book: {} (every internal link and anchor resolves)",
        out.join("index.html").display()
    );
    Ok(())
}

/// The pinned mdBook, installed from crates.io on first use.
fn ensure_mdbook() -> Result<PathBuf, String> {
    let dir = tool_cache()?.join(format!("tools/mdbook-{MDBOOK_VERSION}"));
    let bin = dir.join("bin/mdbook");
    if bin.is_file() {
        return Ok(bin);
    }
    eprintln!("nginx-build: installing mdbook {MDBOOK_VERSION} into {}", dir.display());
    let status = crate::cargo::command()
        .args([
            "install",
            "--locked",
            "--no-default-features",
            "--features",
            "search",
            "--root",
        ])
        .arg(&dir)
        .arg(format!("mdbook@{MDBOOK_VERSION}"))
        .status()
        .map_err(|e| format!("cargo install mdbook: {e}"))?;
    if !status.success() || !bin.is_file() {
        return Err(format!("cargo install mdbook@{MDBOOK_VERSION} failed"));
    }
    Ok(bin)
}

/// Every `href`/`src` of the built book that points inside it and does not
/// resolve: a missing file, or an anchor the target page has no id for.
/// External links (with a scheme) are not followed; the print page, which
/// repeats every chapter with rewritten links, is left out.
pub fn check_links(book: &Path) -> Result<Vec<String>, String> {
    let mut pages = BTreeMap::new();
    collect_html(book, book, &mut pages)?;
    let ids: BTreeMap<&PathBuf, BTreeSet<String>> = pages
        .iter()
        .map(|(path, html)| {
            let sel = Selector::parse("[id]").expect("selector");
            let ids = html
                .select(&sel)
                .filter_map(|e| e.value().attr("id").map(str::to_string))
                .collect();
            (path, ids)
        })
        .collect();
    let links = Selector::parse("a[href], img[src], link[href], script[src]").expect("selector");
    let mut broken = Vec::new();
    for (page, html) in &pages {
        if page.file_name().is_some_and(|n| n == "print.html") {
            continue;
        }
        for element in html.select(&links) {
            let v = element.value();
            let Some(target) = v.attr("href").or_else(|| v.attr("src")) else {
                continue;
            };
            if let Some(problem) = resolve(book, page, target, &ids) {
                broken.push(format!("{}: {target}: {problem}", page.display()));
            }
        }
    }
    Ok(broken)
}

/// Why `target`, linked from `page` (relative to the book's root), does not
/// resolve; `None` when it does or leaves the book.
fn resolve(book: &Path, page: &Path, target: &str, ids: &BTreeMap<&PathBuf, BTreeSet<String>>) -> Option<String> {
    if target.is_empty() || target.contains("://") || target.starts_with("mailto:") || target.starts_with("//") {
        return None;
    }
    let (path, fragment) = match target.split_once('#') {
        Some((p, f)) => (p, Some(f)),
        None => (target, None),
    };
    let path = path.split('?').next().unwrap_or("");
    let file = if path.is_empty() {
        page.to_path_buf()
    } else {
        let joined = page.parent().unwrap_or(Path::new("")).join(path);
        let Some(mut normal) = normalize(&joined) else {
            return Some("leaves the book".into());
        };
        if path.ends_with('/') || book.join(&normal).is_dir() {
            normal = normal.join("index.html");
        }
        normal
    };
    if !book.join(&file).is_file() {
        return Some(format!("no file {}", file.display()));
    }
    match fragment {
        Some(f) if !f.is_empty() && ids.get(&file).is_some_and(|set| !set.contains(f)) => {
            Some(format!("no anchor #{f} in {}", file.display()))
        }
        _ => None,
    }
}

/// `a/b/../c` as `a/c`; `None` if it climbs above the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

fn collect_html(book: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Html>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let p = entry.path();
        if p.is_dir() {
            collect_html(book, &p, out)?;
        } else if p.extension().is_some_and(|e| e == "html") {
            let text = std::fs::read_to_string(&p).map_err(|e| format!("reading {}: {e}", p.display()))?;
            let rel = p.strip_prefix(book).expect("under the book").to_path_buf();
            out.insert(rel, Html::parse_document(&text));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broken_files_and_anchors_are_found() {
        let dir = std::env::temp_dir().join(format!("book-links-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("guide")).unwrap();
        std::fs::write(
            dir.join("index.html"),
            r##"<h1 id="top">x</h1>
            <a href="guide/a.html#setup">ok</a>
            <a href="guide/a.html#nowhere">bad anchor</a>
            <a href="missing.html">bad file</a>
            <a href="#top">same page</a>
            <a href="#gone">same page, bad</a>
            <a href="../outside.html">outside</a>
            <a href="https://example.com/x#y">external</a>"##,
        )
        .unwrap();
        std::fs::write(
            dir.join("guide/a.html"),
            r#"<h2 id="setup">s</h2><a href="../index.html">up</a>"#,
        )
        .unwrap();
        let broken = check_links(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(broken.len(), 4, "{broken:#?}");
        assert!(broken.iter().any(|b| b.contains("no anchor #nowhere")));
        assert!(broken.iter().any(|b| b.contains("no file missing.html")));
        assert!(broken.iter().any(|b| b.contains("#gone")));
        assert!(broken.iter().any(|b| b.contains("leaves the book")));
    }
}
