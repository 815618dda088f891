//! What the tests over the golden cases share.

use controller::model::BuildOptions;
use controller::snapshot::{ConfigMapRefs, Snapshot};
use controller::source::manifests::ManifestDir;

/// The build options of golden case `case` (its directory's name).
pub fn options(case: &str) -> BuildOptions {
    BuildOptions {
        allow_snippets: case == "snippets-allowed",
        ssl_passthrough: case == "ssl-passthrough",
        default_backend_service: (case == "default-backend").then(|| ("infra".into(), "fallback".into())),
        resolvers: if case == "external-auth" {
            vec!["10.96.0.10".parse().unwrap(), "fd00::10".parse().unwrap()]
        } else {
            Vec::new()
        },
        ..BuildOptions::default()
    }
}

/// Golden case `dir`'s manifests as a snapshot.
pub fn snapshot(dir: &std::path::Path) -> Snapshot {
    let cm = |name: &str| ("ingress-nginx".to_string(), name.to_string());
    let mut manifests = ManifestDir::new(
        dir.to_path_buf(),
        ConfigMapRefs {
            config_map: cm("ingress-nginx-controller"),
            tcp_services: Some(cm("tcp-services")),
            udp_services: Some(cm("udp-services")),
        },
    );
    let (snap, read_problems) = manifests.read();
    assert!(read_problems.is_empty(), "{}: {read_problems:?}", dir.display());
    snap
}

/// Every golden case's directory, sorted.
pub fn cases() -> Vec<std::path::PathBuf> {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut cases: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    cases
}
