//! `nginx-build gateway-types [--check]`: the Gateway API types of
//! `gateway-api-types`, generated from the v1.7.0 release's CRDs.
//!
//! The `gateway-api` crate tracks an older Gateway API (v1.5.1) and pins an
//! older kube, so the types are generated here with kopium (crates.io, a
//! pinned version installed once per machine into the tool cache) from the
//! standard-channel CRDs of the `sigs.k8s.io/gateway-api@v1.7.0` Go module
//! (the Go module proxy serves it; `go mod download` keeps it in the module
//! cache), formatted with the workspace's rustfmt settings and committed.
//! HTTPRoute alone comes from the experimental channel (see [`channel`]).
//! `--check` regenerates into memory and fails if a committed file differs;
//! the unit test below runs it, so a hand edit or a kopium drift fails CI.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::build::{tool_cache, workspace_root};

/// The Gateway API release the types come from.
pub const GATEWAY_API_VERSION: &str = "v1.7.0";
const KOPIUM_VERSION: &str = "0.24.1";
/// Gateway API v1.7 needs Go 1.27; this machine's Go fetches it.
pub const GO_TOOLCHAIN: &str = "go1.27.3";

/// The kinds we read, by CRD plural, and the served version we generate.
/// ReferenceGrant is stored as v1beta1 but served as v1 since v1.5.
const KINDS: [&str; 10] = [
    "backendtlspolicies",
    "gatewayclasses",
    "gateways",
    "httproutes",
    "grpcroutes",
    "listenersets",
    "referencegrants",
    "tcproutes",
    "tlsroutes",
    "udproutes",
];
const API_VERSION: &str = "v1";

/// The channel a kind's CRD is read from. HTTPRoute's experimental schema
/// is the standard one plus `sessionPersistence` (which the controller
/// serves), `useDefaultGateways` and the `ExternalAuth` filter (which it
/// reports as unsupported): reading the superset lets a cluster with the
/// experimental CRDs installed send routes that use them without the whole
/// list failing to parse, and on a standard-channel cluster the extra
/// fields are simply absent.
fn channel(plural: &str) -> &'static str {
    match plural {
        "httproutes" => "experimental",
        _ => "standard",
    }
}

/// Writes (or with `check`, compares) `gateway-api-types/src/<plural>.rs`.
pub fn run(args: &[String]) -> Result<(), String> {
    let check = match args.first().map(String::as_str) {
        None => false,
        Some("--check") => true,
        Some(other) => return Err(format!("gateway-types: unknown argument {other:?} (only --check)")),
    };
    let kopium = ensure_kopium()?;
    let crds = crd_dir()?;
    let out = workspace_root().join("gateway-api-types/src");
    let mut stale = Vec::new();
    for kind in KINDS {
        let text = generate(&kopium, &crds, kind)?;
        let path = out.join(format!("{kind}.rs"));
        if check {
            if std::fs::read_to_string(&path).ok().as_deref() != Some(&text) {
                stale.push(path.display().to_string());
            }
        } else {
            std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
            println!("gateway-types: wrote {}", path.display());
        }
    }
    if !stale.is_empty() {
        return Err(format!(
            "these files differ from what kopium {KOPIUM_VERSION} generates from Gateway API \
             {GATEWAY_API_VERSION}'s CRDs (run `cargo run -p nginx-build -- gateway-types`):\n{}",
            stale.join("\n")
        ));
    }
    Ok(())
}

/// kopium's output for one CRD, formatted as `cargo fmt` would.
fn generate(kopium: &Path, crds: &Path, plural: &str) -> Result<String, String> {
    let file = format!("gateway.networking.k8s.io_{plural}.yaml");
    let channel = channel(plural);
    // Run in the CRD directory with a relative file name: kopium writes its
    // command line into the header, which must not name this machine's paths.
    let generated = Command::new(kopium)
        .current_dir(crds.join(channel))
        .args(["-f", &file, "--api-version", API_VERSION])
        .output()
        .map_err(|e| format!("running {}: {e}", kopium.display()))?;
    if !generated.status.success() {
        return Err(format!(
            "kopium {file}: {}",
            String::from_utf8_lossy(&generated.stderr).trim()
        ));
    }
    let header = format!("// Gateway API {GATEWAY_API_VERSION}, {channel} channel (sigs.k8s.io/gateway-api@{GATEWAY_API_VERSION}/config/crd/{channel}).\n");
    let mut text = header.into_bytes();
    text.extend_from_slice(&generated.stdout);
    rustfmt(&text)
}

fn rustfmt(source: &[u8]) -> Result<String, String> {
    use std::io::Write;
    let mut child = Command::new("rustfmt")
        .args(["--edition", "2021", "--config-path"])
        .arg(workspace_root().join("rustfmt.toml"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running rustfmt: {e}"))?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(source)
        .map_err(|e| format!("rustfmt stdin: {e}"))?;
    let out = child.wait_with_output().map_err(|e| format!("rustfmt: {e}"))?;
    if !out.status.success() {
        return Err(format!("rustfmt: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("rustfmt output: {e}"))
}

/// The pinned kopium, installed from crates.io on first use.
fn ensure_kopium() -> Result<PathBuf, String> {
    let dir = tool_cache()?.join(format!("tools/kopium-{KOPIUM_VERSION}"));
    let bin = dir.join("bin/kopium");
    if bin.is_file() {
        return Ok(bin);
    }
    eprintln!("nginx-build: installing kopium {KOPIUM_VERSION} into {}", dir.display());
    let status = crate::cargo::command()
        .args(["install", "--locked", "--root"])
        .arg(&dir)
        .arg(format!("kopium@{KOPIUM_VERSION}"))
        .status()
        .map_err(|e| format!("cargo install kopium: {e}"))?;
    if !status.success() || !bin.is_file() {
        return Err(format!("cargo install kopium@{KOPIUM_VERSION} failed"));
    }
    Ok(bin)
}

/// The release's CRD directory (`standard/` and `experimental/` below it),
/// from the Go module cache (`go mod download` fetches the module from the
/// Go module proxy the first time).
pub fn crd_dir() -> Result<PathBuf, String> {
    let out = Command::new("go")
        .args(["mod", "download", "-json"])
        .arg(format!("sigs.k8s.io/gateway-api@{GATEWAY_API_VERSION}"))
        // Outside any module, so no go.mod around decides anything.
        .current_dir(std::env::temp_dir())
        // The v1.7 module says `go 1.27.0`; the Go module proxy serves that
        // toolchain (the and README's pin).
        .env("GOTOOLCHAIN", GO_TOOLCHAIN)
        .output()
        .map_err(|e| format!("running go (Go is needed to fetch the Gateway API CRDs): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "go mod download sigs.k8s.io/gateway-api@{GATEWAY_API_VERSION}: {}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let info: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("go mod download -json: {e}"))?;
    let dir = info["Dir"].as_str().ok_or("go mod download -json printed no Dir")?;
    let crds = Path::new(dir).join("config/crd");
    if !crds.join("standard").is_dir() || !crds.join("experimental").is_dir() {
        return Err(format!("{} is missing", crds.display()));
    }
    Ok(crds)
}

#[cfg(test)]
mod tests {
    /// The committed types are exactly what the pinned kopium makes of the
    /// release's CRDs.
    #[test]
    fn committed_types_match_their_regeneration() {
        super::run(&["--check".to_string()]).unwrap();
    }
}
