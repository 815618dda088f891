//! `nginx-build gateway-crds [--check]`: the Gateway API release's
//! standard-channel CRDs, as the chart installs them when
//! `gatewayAPI.crds.install` is set.
//!
//! They come from the same `sigs.k8s.io/gateway-api@v1.7.0` Go module as
//! the generated types ([`crate::gateway_types`]), one file per CRD, each
//! with one annotation added: `helm.sh/resource-policy: keep`, so that
//! uninstalling the chart never deletes a CRD, and with it every Gateway
//! and route in the cluster. Nothing else of the release's text changes.
//! `--check` compares instead of writing; the unit test below runs it, so
//! a hand edit or a release bump without regeneration fails CI.

use std::path::{Path, PathBuf};

use crate::build::workspace_root;
use crate::gateway_types::{crd_dir, GATEWAY_API_VERSION};

/// Where the chart keeps them (read by `templates/gateway-api-crds.yaml`).
fn out_dir() -> PathBuf {
    workspace_root().join("deploy/helm/dynamic-balancer/gateway-api-crds")
}

/// The annotation that keeps a CRD when the release goes.
const KEEP: &str = "    helm.sh/resource-policy: keep\n";

/// Writes (or with `check`, compares) the chart's copy of every
/// standard-channel CRD.
pub fn run(args: &[String]) -> Result<(), String> {
    let check = match args.first().map(String::as_str) {
        None => false,
        Some("--check") => true,
        Some(other) => return Err(format!("gateway-crds: unknown argument {other:?} (only --check)")),
    };
    let wanted = generate(&crd_dir()?.join("standard"))?;
    let out = out_dir();
    let mut stale = Vec::new();
    let committed: Vec<String> = std::fs::read_dir(&out)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(".yaml"))
                .collect()
        })
        .unwrap_or_default();
    if !check {
        std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
        for name in committed.iter().filter(|n| !wanted.iter().any(|(w, _)| w == *n)) {
            std::fs::remove_file(out.join(name)).map_err(|e| format!("removing {name}: {e}"))?;
        }
    } else {
        stale.extend(
            committed
                .iter()
                .filter(|n| !wanted.iter().any(|(w, _)| w == *n))
                .map(|n| format!("{n} (not in the release)")),
        );
    }
    for (name, text) in &wanted {
        let path = out.join(name);
        if check {
            if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                stale.push(path.display().to_string());
            }
        } else {
            std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
            println!("gateway-crds: wrote {}", path.display());
        }
    }
    if !stale.is_empty() {
        return Err(format!(
            "the chart's Gateway API CRDs differ from {GATEWAY_API_VERSION}'s (run `cargo run -p nginx-build -- gateway-crds`):\n{}",
            stale.join("\n")
        ));
    }
    Ok(())
}

/// Every CRD file of the release's standard channel (file name, text with
/// the keep annotation), sorted by name. The channel's other file (a
/// ValidatingAdmissionPolicy guarding upgrades) is not a CRD and is left
/// to whoever manages the cluster's admission policies.
fn generate(crds: &Path) -> Result<Vec<(String, String)>, String> {
    let mut names: Vec<String> = std::fs::read_dir(crds)
        .map_err(|e| format!("reading {}: {e}", crds.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("gateway.networking.k8s.io_") && n.ends_with(".yaml"))
        .collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let text = std::fs::read_to_string(crds.join(&name)).map_err(|e| format!("reading {name}: {e}"))?;
        if !text.contains("\nkind: CustomResourceDefinition\n") {
            continue;
        }
        out.push((
            name.clone(),
            keep(&text).ok_or_else(|| format!("{name}: no metadata.annotations to add to"))?,
        ));
    }
    if out.is_empty() {
        return Err(format!("no CRD in {}", crds.display()));
    }
    Ok(out)
}

/// `text` with the keep annotation first among `metadata.annotations`
/// (the release's CRDs all carry some: its bundle version and channel).
fn keep(text: &str) -> Option<String> {
    let at = text.find("\nmetadata:\n  annotations:\n")? + "\nmetadata:\n  annotations:\n".len();
    Some(format!("{}{KEEP}{}", &text[..at], &text[at..]))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_keep_annotation_goes_under_metadata() {
        let crd = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  annotations:\n    a: b\n  name: x\nspec:\n  annotations:\n";
        assert_eq!(
            super::keep(crd).unwrap(),
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  annotations:\n    helm.sh/resource-policy: keep\n    a: b\n  name: x\nspec:\n  annotations:\n"
        );
        assert_eq!(super::keep("metadata:\n  name: x\n"), None);
    }

    /// The chart's CRDs are exactly the release's, with the keep annotation.
    #[test]
    fn committed_crds_match_the_release() {
        super::run(&["--check".to_string()]).unwrap();
    }
}
