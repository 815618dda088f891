//! The plugin binary without a cluster: its help names every subcommand
//! ingress-nginx's plugin has, and a cluster it cannot reach is a clear
//! error with a failing exit code, not a hang.

use std::process::Command;

fn plugin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kubectl-dynamic_balancer"))
}

#[test]
fn help_lists_ingress_nginx_subcommands_and_check() {
    let out = plugin().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for sub in [
        "backends",
        "certs",
        "conf",
        "general",
        "info",
        "ingresses",
        "check",
        "logs",
        "exec",
    ] {
        assert!(help.contains(&format!("  {sub} ")), "{sub} missing:\n{help}");
    }
    assert!(
        help.contains("[alias: lint]") || help.contains("[aliases: lint]"),
        "{help}"
    );
}

#[test]
fn an_unreachable_cluster_fails_quickly_and_says_where() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("config");
    // A loopback port with nothing listening on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context: {{cluster: c, user: u, namespace: edge}}\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let out = plugin()
        .args(["backends", "--request-timeout=5s", "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.starts_with("error: "), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    // `exec` needs the command after `--`.
    let out = plugin().args(["exec"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
