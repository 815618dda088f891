//! `cluster`: a real single-node Kubernetes cluster on this machine (see
//! `tests/src/cluster`), for trying the controller where it runs in
//! production, the way people use kind.
//!
//! ```text
//! cargo run --release -p nginx-build -- image          # the project's image
//! cargo run --release -p tests --bin cluster -- up --install
//! export KUBECONFIG=/var/lib/dynamic-balancer-cluster/admin.kubeconfig
//! cargo run --release -p tests --bin cluster -- down
//! ```
//!
//! `up` builds or finds the node's binaries (tests/kube/build.sh node),
//! brings the node up and leaves it running; `--install` (or `install`
//! later) installs deploy/helm/dynamic-balancer with two replicas;
//! `status` lists the node and its Pods; `down` takes it all away. Needs root, Debian
//! (apt for the packages the tier unpacks), buildah, and cgroup v1 or v2.

use std::path::PathBuf;
use std::process::ExitCode;

use tests::cluster::{self, images, Cluster, Images, NODE_IP};

fn usage() -> ExitCode {
    eprintln!("usage: cluster up [--install] | cluster install | cluster down | cluster status");
    ExitCode::from(2)
}

fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

fn install(c: &Cluster) -> Result<(), String> {
    let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/dynamic-balancer");
    let out = c.helm(&[
        "upgrade",
        "--install",
        tests::kube_apiserver::RELEASE,
        &chart.display().to_string(),
        "--namespace",
        tests::kube_apiserver::RELEASE_NAMESPACE,
        "--create-namespace",
        "--set",
        "controller.replicaCount=2",
        "--wait",
        "--timeout",
        "5m",
    ])?;
    println!("{out}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        return usage();
    };
    let result = match cmd.as_str() {
        "up" => {
            let backend = sibling("pod-backend");
            if !backend.exists() {
                eprintln!(
                    "cluster: {} is missing: cargo build --release -p tests --bin pod-backend",
                    backend.display()
                );
                return ExitCode::FAILURE;
            }
            let controller = std::process::Command::new("buildah")
                .args(["inspect", "--type", "image", images::CONTROLLER_IMAGE])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if !controller {
                eprintln!(
                    "cluster: no image {} in buildah's storage; build it first: cargo run --release -p nginx-build -- image",
                    images::CONTROLLER_IMAGE
                );
                return ExitCode::FAILURE;
            }
            Cluster::up(&Images {
                backend: &backend,
                controller: true,
            })
            .and_then(|c| {
                println!("cluster: node up ({})", c.timings);
                if args.iter().any(|a| a == "--install") {
                    install(&c)?;
                }
                let l = c.keep();
                println!(
                    "export KUBECONFIG={}\n# Pods {}, Services {}, the node {NODE_IP}; \
                     take it down with: cargo run --release -p tests --bin cluster -- down",
                    l.kubeconfig("admin").display(),
                    cluster::POD_CIDR,
                    cluster::SERVICE_CIDR
                );
                Ok(())
            })
        }
        "install" => Cluster::attach().and_then(|c| install(&c)),
        "status" => Cluster::attach().and_then(|c| {
            println!("{}", c.kubectl(&["get", "nodes,pods", "-A", "-o", "wide"])?);
            Ok(())
        }),
        "down" => cluster::down().map(|r| println!("cluster: {r}")),
        _ => return usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cluster: {e}");
            ExitCode::FAILURE
        }
    }
}
