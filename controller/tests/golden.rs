//! Golden tests: each `tests/golden/<case>/input.yaml` is built into a model
//! and rendered; the result must equal `expected/nginx.conf`,
//! `expected/backends.json` and `expected/problems.txt`. `UPDATE_GOLDEN=1 cargo test -p controller`
//! rewrites them (review the diff before committing).

use std::path::{Path, PathBuf};

mod common;

use common::options;
use controller::model::build;
use controller::render::{RenderContext, Renderer};

fn context() -> RenderContext {
    RenderContext {
        module_path: "/usr/lib/nginx/modules/ngx_http_dynamic_balancer_module.so".into(),
        pid_file: "/run/nginx.pid".into(),
        error_log: "/var/log/nginx/error.log".into(),
        error_log_level: "notice".into(),
        access_log: "/var/log/nginx/access.log".into(),
        zone_size: "32m".into(),
        default_certificate: "/etc/nginx/ssl/default-fake-certificate.pem".into(),
        supervised: true,
        api_token_file: Some("/etc/nginx/api-token".into()),
        metrics: true,
        metrics_per_host: true,
        cpus: 2,
        https_socket: "/etc/nginx/https.sock".into(),
        socket_dir: "/etc/nginx".into(),
        auth_dir: "/etc/nginx/auth".into(),
    }
}

/// Runs one case; returns a description of every mismatch.
fn run_case(dir: &Path) -> Vec<String> {
    let case = dir.file_name().unwrap().to_string_lossy().to_string();
    let snap = common::snapshot(dir);
    let model = build(&snap, &options(&case));
    let conf = Renderer::new(None)
        .unwrap()
        .render(model.structure.as_ref().unwrap(), &context())
        .unwrap_or_else(|e| panic!("{case}: {e:#}"));
    let backends =
        serde_json::to_string_pretty(&model.backends.values().map(|b| &**b).collect::<Vec<_>>()).unwrap() + "\n";
    let mut problems: Vec<String> = model.problems.iter().map(ToString::to_string).collect();
    problems.sort();
    let problems = problems.join("\n") + "\n";

    let mut mismatches = Vec::new();
    // Every file the rendered configuration names passes the check run
    // before each `nginx -t` (nothing of the template's own is refused).
    let ctx = context();
    let roots = controller::file_check::FileRoots::new(
        Path::new("/etc/nginx"),
        Path::new(&ctx.module_path),
        &[PathBuf::from(&ctx.default_certificate)],
        &[
            PathBuf::from(&ctx.error_log),
            PathBuf::from(&ctx.access_log),
            PathBuf::from(&ctx.pid_file),
        ],
    );
    if let Err(r) = controller::file_check::check(&conf, Path::new("nginx.conf"), &roots) {
        mismatches.push(format!(
            "{case}: the file check refuses the rendered configuration: {}",
            r.message
        ));
    }
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    for (file, actual) in [
        ("nginx.conf", &conf),
        ("backends.json", &backends),
        ("problems.txt", &problems),
    ] {
        let path = dir.join("expected").join(file);
        if update {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, actual).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        if expected != *actual {
            let first = expected
                .lines()
                .zip(actual.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(expected.lines().count().min(actual.lines().count()));
            mismatches.push(format!(
                "{case}/{file} differs at line {}:\n  expected: {:?}\n  actual:   {:?}",
                first + 1,
                expected.lines().nth(first),
                actual.lines().nth(first)
            ));
        }
    }
    mismatches
}

#[test]
fn golden_cases() {
    let cases = common::cases();
    assert!(cases.len() >= 6, "golden cases missing");
    let mismatches: Vec<String> = cases.iter().flat_map(|c| run_case(c)).collect();
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
