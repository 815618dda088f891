//! The `cargo` that nginx-build runs for its nested builds, with the
//! environment `cargo run` gave nginx-build itself taken away.
//!
//! `cargo run -p nginx-build` sets `CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`,
//! `CARGO_PKG_VERSION_*` and the like to nginx-build's own values. A nested
//! `cargo` passes them on, and some build scripts (ring's, through the `cc`
//! crate) declare `rerun-if-env-changed` on exactly those names: cargo then
//! sees them "changed" against README's top-level `cargo test`, runs ring's
//! build script again and rebuilds everything that depends on ring (rustls,
//! kube, the controller, the tests: 12 minutes of CI's `deb-test` went on
//! that). Without them, a nested build reuses what the top-level one built.

use std::ffi::OsString;
use std::process::Command;

/// The `cargo` that runs nginx-build (`$CARGO`, else the one on `PATH`),
/// without the package variables `cargo run` set for nginx-build.
pub fn command() -> Command {
    let program: OsString = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(program);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(is_package_variable) {
            cmd.env_remove(&name);
        }
    }
    cmd
}

/// Variables cargo sets for the package it builds or runs, as opposed to
/// the ones that configure cargo (`CARGO_HOME`, `CARGO_TARGET_DIR`, ...).
fn is_package_variable(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || matches!(
            name,
            "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR" | "OUT_DIR"
        )
}

#[cfg(test)]
mod tests {
    use super::is_package_variable;

    #[test]
    fn package_variables_go_and_cargo_settings_stay() {
        for gone in [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_CRATE_NAME",
            "CARGO_BIN_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "OUT_DIR",
        ] {
            assert!(is_package_variable(gone), "{gone}");
        }
        for kept in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_TERM_COLOR",
            "RUSTFLAGS",
            "PATH",
        ] {
            assert!(!is_package_variable(kept), "{kept}");
        }
    }
}
