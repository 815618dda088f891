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
//!
//! `conformance [--profiles P,Q] [--run-test NAME] [--skip-tests A,B] [--out DIR] [--keep]`
//! brings a node up, installs the Gateway API CRDs and the chart with
//! Gateway API on, and runs the official conformance suite (v1.7.0,
//! GATEWAY-HTTP, -GRPC, -TLS, -TCP and -UDP unless `--profiles`) against it; the report and the suite's log land in
//! `--out` (default target/gateway-conformance). The node is taken down
//! afterwards unless `--keep`.

use std::path::PathBuf;
use std::process::ExitCode;

use tests::cluster::{self, images, Cluster, Images, NODE_IP};

fn usage() -> ExitCode {
    eprintln!(
        "usage: cluster up [--install] | cluster install | cluster down | cluster status\n       \
         cluster conformance [--profiles P,Q] [--run-test NAME] [--skip-tests A,B] [--out DIR] [--keep]"
    );
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

/// The value after `flag` in `args`.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// Checks what `up` needs from the workspace build.
fn preflight() -> Result<PathBuf, String> {
    let backend = sibling("pod-backend");
    if !backend.exists() {
        return Err(format!(
            "{} is missing: cargo build --release -p tests --bin pod-backend",
            backend.display()
        ));
    }
    let controller = std::process::Command::new("buildah")
        .args(["inspect", "--type", "image", images::CONTROLLER_IMAGE])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !controller {
        return Err(format!(
            "no image {} in buildah's storage; build it first: cargo run --release -p nginx-build -- image",
            images::CONTROLLER_IMAGE
        ));
    }
    Ok(backend)
}

fn conformance(args: &[String]) -> Result<(), String> {
    use tests::cluster::conformance as suite;
    let out = PathBuf::from(
        flag_value(args, "--out").unwrap_or(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/gateway-conformance")),
    );
    let mut opts = suite::Options::new(&out);
    if let Some(p) = flag_value(args, "--profiles") {
        opts.profiles = p.to_string();
    }
    opts.run_test = flag_value(args, "--run-test").map(str::to_string);
    opts.skip_tests = flag_value(args, "--skip-tests")
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let bin = suite::binaries()?;
    let backend = preflight()?;
    let c = Cluster::up(&Images {
        backend: &backend,
        controller: true,
    })?;
    println!("conformance: node up ({})", c.timings);
    suite::import_echo(&c, &bin)?;
    suite::install_crds(&c)?;
    suite::install_controller(&c)?;
    let features = suite::gateway_class(&c)?;
    println!(
        "conformance: GatewayClass {} accepted; features {}",
        suite::GATEWAY_CLASS,
        features.join(",")
    );
    let reloads_before = suite::reloads(&c);
    let outcome = suite::run(&c, &bin, &features, &opts);
    match (reloads_before, suite::reloads(&c)) {
        (Ok(a), Ok(b)) => println!(
            "conformance: nginx reloads during the suite: {} ({a} before, {b} after)",
            b - a
        ),
        (Err(e), _) | (_, Err(e)) => println!("conformance: reloads not counted: {e}"),
    }
    if args.iter().any(|a| a == "--keep") {
        let l = c.keep();
        println!(
            "conformance: node kept; export KUBECONFIG={}",
            l.kubeconfig("admin").display()
        );
    }
    let outcome = outcome?;
    println!(
        "conformance: {} passed, {} failed, {} skipped in {:.0?}; report {}, log {}",
        outcome.passed.len(),
        outcome.failed.len(),
        outcome.skipped.len(),
        outcome.elapsed,
        opts.report.display(),
        opts.log.display()
    );
    for f in &outcome.failed {
        println!("  FAIL {f}");
    }
    if outcome.success {
        Ok(())
    } else {
        Err("the conformance suite failed".into())
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        return usage();
    };
    if args.iter().any(|a| a == "-h" || a == "--help") {
        usage();
        return ExitCode::SUCCESS;
    }
    // An unknown or misspelt flag is an error, never a run with defaults
    // (a conformance run takes minutes and replaces the node).
    let (valued, switches): (&[&str], &[&str]) = match cmd.as_str() {
        "up" => (&[], &["--install"]),
        "conformance" => (&["--profiles", "--run-test", "--skip-tests", "--out"], &["--keep"]),
        _ => (&[], &[]),
    };
    let mut rest = args[1..].iter();
    while let Some(a) = rest.next() {
        if valued.contains(&a.as_str()) {
            if rest.next().is_none() {
                eprintln!("cluster {cmd}: {a} needs a value");
                return usage();
            }
        } else if !switches.contains(&a.as_str()) {
            eprintln!("cluster {cmd}: unknown argument {a:?}");
            return usage();
        }
    }
    let result = match cmd.as_str() {
        "up" => {
            let backend = match preflight() {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("cluster: {e}");
                    return ExitCode::FAILURE;
                }
            };
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
        "conformance" => conformance(&args[1..]),
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
