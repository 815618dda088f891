//! The layering of the crates' modules, checked from their sources: no
//! module imports one that (directly or through others) imports it back.
//!
//! An edge is any `crate::name` (or, inside a directory module,
//! `super::name`) in a file; the check finds strongly connected components
//! of that graph (Tarjan), so every cycle is named with its members.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module name → the modules it names, for one crate's `src/`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    imports(src).0
}

/// The module graph, and each module's `crate::` paths that name no module
/// (items of the crate root, `lib.rs` or `main.rs`).
#[allow(clippy::type_complexity)]
fn imports(src: &Path) -> (BTreeMap<String, BTreeSet<String>>, BTreeMap<String, BTreeSet<String>>) {
    let mut files = Vec::new();
    collect(src, &mut files);
    let mut modules: BTreeMap<String, String> = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(src).unwrap().with_extension("");
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .filter(|p| p != "mod")
            .collect();
        let name = parts.join("::");
        if name == "lib" || name == "main" {
            continue;
        }
        modules.insert(name, std::fs::read_to_string(file).unwrap());
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let mut edges = BTreeMap::new();
    let mut root = BTreeMap::new();
    for (name, text) in &modules {
        let parent = name.rsplit_once("::").map(|(p, _)| p.to_string());
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut to = BTreeSet::new();
        let mut to_root = BTreeSet::new();
        for (prefix, base) in [("crate::", None), ("super::", parent.as_deref())] {
            for (at, _) in code.match_indices(prefix) {
                let mut rest = &code[at + prefix.len()..];
                let mut base = base.map(str::to_string);
                if prefix == "super::" {
                    // A chain (`super::super::x`) is read once, from its start.
                    if code[..at].ends_with("super::") {
                        continue;
                    }
                    while let Some(r) = rest.strip_prefix("super::") {
                        rest = r;
                        base = base.and_then(|b| b.rsplit_once("::").map(|(p, _)| p.to_string()));
                    }
                }
                for path in paths_after(rest) {
                    let full = match &base {
                        Some(b) => format!("{b}::{path}"),
                        None => path,
                    };
                    // The longest module name the path starts with.
                    let segs: Vec<&str> = full.split("::").filter(|s| !s.is_empty()).collect();
                    if let Some(target) = (1..=segs.len())
                        .rev()
                        .map(|k| segs[..k].join("::"))
                        .find(|m| names.contains(m))
                    {
                        if target != *name && !name.starts_with(&format!("{target}::")) {
                            to.insert(target);
                        }
                    } else if prefix == "crate::" && !full.is_empty() {
                        to_root.insert(full);
                    }
                }
            }
        }
        edges.insert(name.clone(), to);
        if !to_root.is_empty() {
            root.insert(name.clone(), to_root);
        }
    }
    (edges, root)
}

/// The paths a `crate::`/`super::` prefix leads to: one (`a::b`), or each
/// member of a group (`{a, b::{c, d}}`, across lines), as `a`, `b::c`...
fn paths_after(rest: &str) -> Vec<String> {
    let word: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
        .collect();
    let after = &rest[word.len()..];
    if !after.starts_with('{') {
        return vec![word];
    }
    // The group's text up to its matching brace.
    let mut depth = 0;
    let mut end = after.len();
    for (i, c) in after.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    end = i;
                    break;
                }
            }
            _ => {}
        }
    }
    let inner = &after[1..end];
    // Split at top-level commas.
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty() && *p != "self")
        .flat_map(|p| {
            paths_after(p)
                .into_iter()
                .map(|q| format!("{word}{q}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Strongly connected components with more than one member.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn crate_src(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

#[test]
fn no_crate_has_an_import_cycle() {
    let mut found = Vec::new();
    for krate in [
        "lua-compat",
        "ngx-module",
        "controller",
        "nginx-build",
        "balancer-cli",
        "kubectl-plugin",
        "tests",
    ] {
        let g = graph(&crate_src(krate));
        for c in cycles(&g) {
            found.push(format!("{krate}: {}", c.join(" <-> ")));
        }
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

#[test]
fn grouped_imports_are_edges() {
    assert_eq!(paths_after("zone::Zone;"), ["zone::Zone"]);
    assert_eq!(
        paths_after("{push, reload::{self, task}, state::Shared};"),
        ["push", "reload::task", "state::Shared"]
    );
}

#[test]
fn the_checker_finds_a_cycle() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), ["b".to_string()].into()),
        ("b".to_string(), ["c".to_string()].into()),
        ("c".to_string(), ["a".to_string()].into()),
        ("d".to_string(), ["a".to_string()].into()),
    ]
    .into();
    assert_eq!(
        cycles(&g),
        vec![vec!["a".to_string(), "b".to_string(), "c".to_string()]]
    );
}

/// Each module's floor: 0 for a module that imports none of its crate's
/// modules, else one above the highest module it imports. Defined when the
/// graph has no cycle; an import that closes one counts as nothing here
/// (the cycle test names it), so a cycle cannot recurse without end.
fn floors(g: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, usize> {
    fn floor(
        g: &BTreeMap<String, BTreeSet<String>>,
        m: &str,
        memo: &mut BTreeMap<String, usize>,
        open: &mut BTreeSet<String>,
    ) -> usize {
        if let Some(f) = memo.get(m) {
            return *f;
        }
        if !open.insert(m.to_string()) {
            return 0;
        }
        let f = g
            .get(m)
            .into_iter()
            .flatten()
            .map(|t| floor(g, t, memo, open) + 1)
            .max()
            .unwrap_or(0);
        open.remove(m);
        memo.insert(m.to_string(), f);
        f
    }
    let mut memo = BTreeMap::new();
    for m in g.keys() {
        floor(g, m, &mut memo, &mut BTreeSet::new());
    }
    memo
}

/// `ngx-module/src`'s folders, bottom first. A file may import from its own
/// folder or from a folder below it, never from one above: the request
/// path cannot reach the API, nothing but the crate root reaches the
/// directives (they run at configuration time only), and a new folder has
/// to be given its place here.
const MODULE_FOLDERS: [&str; 11] = [
    "nginx",
    "shm",
    "otel",
    "conf",
    "backends",
    "http",
    "tls",
    "api",
    "stream",
    "process",
    "directives",
];

/// The floor of a module of `ngx-module`: its folder's place in
/// [`MODULE_FOLDERS`].
fn folder_floor(module: &str) -> Option<usize> {
    let top = module.split("::").next()?;
    MODULE_FOLDERS.iter().position(|f| *f == top)
}

/// The module's folders: every file is in one, every import points down
/// (or within its folder), and no file imports the crate root, whose
/// statics would otherwise be the thing every file climbs up to.
#[test]
fn module_folders_point_down() {
    let src = crate_src("ngx-module");
    let (g, root) = imports(&src);
    let mut wrong = Vec::new();
    for (m, paths) in &root {
        wrong.push(format!(
            "{m} imports the crate root: {}",
            paths.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    let mut by_folder: BTreeMap<usize, BTreeSet<&str>> = BTreeMap::new();
    for (m, to) in &g {
        let Some(from) = folder_floor(m) else {
            wrong.push(format!("{m} is in no folder of MODULE_FOLDERS"));
            continue;
        };
        by_folder.entry(from).or_default().insert(m);
        for t in to {
            match folder_floor(t) {
                Some(floor) if floor <= from => {}
                _ => wrong.push(format!("{m} ({}) imports {t}, a floor above", MODULE_FOLDERS[from])),
            }
        }
    }
    // Every folder exists and has its `mod.rs` (the note of what lives there).
    for f in MODULE_FOLDERS {
        if !src.join(f).join("mod.rs").is_file() {
            wrong.push(format!("folder {f} has no mod.rs"));
        }
    }
    assert!(wrong.is_empty(), "ngx-module's layering:\n{}", wrong.join("\n"));
    let (edges, within): (usize, usize) = g.iter().fold((0, 0), |(e, w), (m, to)| {
        let same = to.iter().filter(|t| folder_floor(t) == folder_floor(m)).count();
        (e + to.len(), w + same)
    });
    println!(
        "ngx-module: {} files in {} folders, {edges} imports ({within} within a folder), none upward",
        g.len(),
        MODULE_FOLDERS.len()
    );
    for (floor, ms) in by_folder {
        let files: Vec<&str> = ms
            .iter()
            .map(|m| m.split_once("::").map_or("mod", |(_, f)| f))
            .collect();
        println!("  {floor}: {}/ {}", MODULE_FOLDERS[floor], files.join(" "));
    }
}

#[test]
fn a_root_import_is_found() {
    let dir = std::env::temp_dir().join(format!("architecture-root-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("lib.rs"), "pub struct Module;\n").unwrap();
    std::fs::write(dir.join("a/mod.rs"), "pub mod b;\n").unwrap();
    std::fs::write(
        dir.join("a/b.rs"),
        "use crate::Module;\nuse crate::a::c;\n// crate::Ignored\n",
    )
    .unwrap();
    std::fs::write(dir.join("a/c.rs"), "").unwrap();
    let (g, root) = imports(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(root["a::b"], BTreeSet::from(["Module".to_string()]));
    assert_eq!(g["a::b"], BTreeSet::from(["a::c".to_string()]));
}

/// Prints each crate's floors (`cargo test --test architecture -- --nocapture`)
/// and checks the module's rule: directive setters run at configuration
/// time only, so no request-time module may import them (only `lib.rs`'s
/// command table does).
#[test]
fn floors_and_the_configuration_layer() {
    let module = graph(&crate_src("ngx-module"));
    for (m, to) in &module {
        assert!(!to.contains("directives"), "{m} imports directives");
    }
    for krate in ["ngx-module", "controller", "lua-compat"] {
        let g = graph(&crate_src(krate));
        let f = floors(&g);
        let mut by: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
        for (m, n) in &f {
            by.entry(*n).or_default().push(m);
        }
        println!(
            "{krate}: {} modules, {} imports",
            g.len(),
            g.values().map(BTreeSet::len).sum::<usize>()
        );
        for (n, ms) in by {
            println!("  {n}: {}", ms.join(" "));
        }
    }
}
