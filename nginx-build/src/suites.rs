//! Runs end-to-end suites of the `tests` crate against another nginx and
//! module than `build/nginx`: the harness takes both from
//! `DYNBAL_NGINX_PREFIX` (`sbin/nginx`, `modules/<module>`).

use std::path::Path;
use std::process::ExitStatus;

use crate::build::workspace_root;

/// `cargo test --release --workspace --test <each of tests>` with the
/// harness pointed at `prefix`, plus `env`.
///
/// Workspace-wide, as README's test command, so that dependencies are built
/// with the same features and nothing that command built is built again;
/// the `--no-run` step first builds the binaries the suites run (the
/// controller's, the client's), as that command does.
pub fn run(prefix: &Path, tests: &[String], env: &[(&str, String)]) -> Result<ExitStatus, String> {
    let root = workspace_root();
    let built = crate::cargo::command()
        .args(["test", "--release", "--workspace", "--no-run"])
        .current_dir(&root)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !built.success() {
        return Err(format!("building the tests failed ({built})"));
    }
    let mut cmd = crate::cargo::command();
    cmd.args(["test", "--release", "--workspace", "--no-fail-fast"]);
    for t in tests {
        cmd.args(["--test", t]);
    }
    cmd.current_dir(&root).env(
        "DYNBAL_NGINX_PREFIX",
        std::path::absolute(prefix).map_err(|e| e.to_string())?,
    );
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.status().map_err(|e| format!("cannot run cargo: {e}"))
}
