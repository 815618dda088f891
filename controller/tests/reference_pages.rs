//! The book's generated reference pages (`docs/src/reference/`) are what
//! the code produces: `ingress-controller reference PAGE` for each, as the
//! static manifests are checked against the chart. `UPDATE_GOLDEN=1`
//! rewrites a stale page.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn generated_pages_match_the_code() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference");
    let mut stale = Vec::new();
    for page in controller::reference::PAGES {
        let out = Command::new(env!("CARGO_BIN_EXE_ingress-controller"))
            .args(["reference", page])
            .output()
            .expect("run ingress-controller reference");
        assert!(out.status.success(), "{page}: {}", String::from_utf8_lossy(&out.stderr));
        let generated = String::from_utf8(out.stdout).expect("UTF-8 page");
        let path = dir.join(format!("{page}.md"));
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        if on_disk != generated {
            if std::env::var_os("UPDATE_GOLDEN").is_some() {
                std::fs::write(&path, &generated).unwrap();
            } else {
                stale.push(path.display().to_string());
            }
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated pages (run UPDATE_GOLDEN=1 cargo test -p controller --test reference_pages):\n{}",
        stale.join("\n")
    );
}

#[test]
fn an_unknown_page_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_ingress-controller"))
        .args(["reference", "everything"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("annotations"));
}
