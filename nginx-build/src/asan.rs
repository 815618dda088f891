//! The end-to-end suites against the AddressSanitizer build.
//!
//! The test harness takes nginx and the module from `DYNBAL_NGINX_PREFIX`
//! (here `build/nginx-asan`). Every process writes its sanitizer reports to
//! `build/asan-logs/asan.<pid>`; the run fails if any report appears, even
//! when the tests themselves passed (a worker that dies after answering
//! does not fail a test).

use crate::build::{workspace_root, Artifacts};
use std::fs;

/// The suites that drive the module: its API, balancing, hostile inputs,
/// layer 4, tracing's exporter thread, and the controller end to end.
const DEFAULT_TESTS: &[&str] = &[
    "api",
    "balancing",
    "hostile",
    "lifecycle",
    "upstreams",
    "keepalive_kinds",
    "sticky",
    "canary",
    "algorithms",
    "health",
    "controller",
    "tenants",
    "stream_balancer",
    "l4_services",
    "ssl_passthrough",
    "gateway_routes",
    "gateway_api",
    "gateway_tls",
    "gateway_backend_tls",
    "tracing",
];

pub fn test(artifacts: &Artifacts, args: &[String]) -> Result<(), String> {
    let root = workspace_root();
    let logs = root.join("build/asan-logs");
    let _ = fs::remove_dir_all(&logs);
    fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
    // nginx's workers drop root for `nobody`: they must be able to write
    // their reports here.
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&logs, fs::Permissions::from_mode(0o1777)).map_err(|e| e.to_string())?;
    }
    let tests: Vec<String> = if args.is_empty() {
        DEFAULT_TESTS.iter().map(|t| t.to_string()).collect()
    } else {
        args.to_vec()
    };
    eprintln!("nginx-build: running {} under AddressSanitizer", tests.join(", "));
    // nginx frees its cycle only partly at exit, by design: leaks are not
    // what this run looks for.
    let options = format!("detect_leaks=0:abort_on_error=1:log_path={}/asan", logs.display());
    let status = crate::suites::run(&artifacts.prefix, &tests, &[("ASAN_OPTIONS", options)])?;
    let reports: Vec<String> = fs::read_dir(&logs)
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .map(|e| e.path().display().to_string())
        .collect();
    for r in &reports {
        eprintln!(
            "nginx-build: sanitizer report {r}:\n{}",
            fs::read_to_string(r).unwrap_or_default()
        );
    }
    eprintln!(
        "nginx-build: AddressSanitizer: {} report(s); tests {}",
        reports.len(),
        if status.success() { "passed" } else { "failed" }
    );
    if !reports.is_empty() {
        return Err(format!(
            "{} AddressSanitizer report(s) in {}",
            reports.len(),
            logs.display()
        ));
    }
    if !status.success() {
        return Err(format!("the tests failed under AddressSanitizer ({status})"));
    }
    Ok(())
}
