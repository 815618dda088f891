//! A pod network for the real tier: upstreams listen on a non-loopback
//! address inside a network namespace the tests create.
//!
//! A real apiserver refuses EndpointSlice addresses on loopback (and the
//! controller, by default, refuses them too), so test upstreams on
//! 127.0.0.1 cannot stand for pods there. Instead one namespace,
//! `dynbal-e2e`, holds the "pod" addresses [`POD_IPS`] on one end of a veth
//! pair; the host end has [`NODE_IP`], so nginx on the host connects to pods
//! as it would on a node. Nothing outside this machine can reach either
//! address (a private veth, RFC 2544's benchmarking range), and servers bind
//! only [`POD_IP`] inside the namespace.
//!
//! An upstream's listening socket is created by a thread that has entered
//! the namespace (`setns(2)` is per thread); the socket stays there and is
//! served from an ordinary thread. The namespace is created once per
//! machine (idempotently, under a lock) and left for the next run.

use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::OnceLock;

pub const NETNS: &str = "dynbal-e2e";
/// The host's end of the veth pair.
pub const NODE_IP: &str = "198.18.0.1";
/// The address upstreams listen on, inside [`NETNS`].
pub const POD_IP: &str = "198.18.0.2";
/// Every pod address inside [`NETNS`] ([`POD_IP`] first), for tests that
/// need several pods on one port, as a Service's targetPort has them.
pub const POD_IPS: [&str; 8] = [
    "198.18.0.2",
    "198.18.0.3",
    "198.18.0.4",
    "198.18.0.5",
    "198.18.0.6",
    "198.18.0.7",
    "198.18.0.8",
    "198.18.0.9",
];

fn ip(args: &[&str]) -> (bool, String) {
    let out = Command::new("ip").args(args).output().expect("ip (iproute2)");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn must(args: &[&str]) {
    let (ok, err) = ip(args);
    assert!(ok, "ip {}: {err}", args.join(" "));
}

/// Creates the namespace and the veth pair unless they exist.
pub fn ensure() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let lock = std::fs::File::create("/tmp/dynbal-e2e-netns.lock").unwrap();
        // SAFETY: flock(2) on a file we own; released when `lock` drops.
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        // Ready when every pod address is in place (an older layout had
        // only the first one).
        let inside_addrs = Command::new("ip")
            .args(["netns", "exec", NETNS, "ip", "-4", "addr", "show", "dev", "dbe2e-pod"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let last = format!("{}/24", POD_IPS[POD_IPS.len() - 1]);
        let ready = std::path::Path::new("/run/netns").join(NETNS).exists()
            && inside_addrs.contains(&last)
            && ip(&["link", "show", "dbe2e-node"]).0;
        if !ready {
            let _ = ip(&["netns", "del", NETNS]);
            let _ = ip(&["link", "del", "dbe2e-node"]);
            must(&["netns", "add", NETNS]);
            must(&["link", "add", "dbe2e-node", "type", "veth", "peer", "name", "dbe2e-pod"]);
            must(&["link", "set", "dbe2e-pod", "netns", NETNS]);
            must(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "dbe2e-node"]);
            must(&["link", "set", "dbe2e-node", "up"]);
            let inside = |args: &[&str]| {
                let mut all = vec!["netns", "exec", NETNS, "ip"];
                all.extend_from_slice(args);
                must(&all);
            };
            for pod_ip in POD_IPS {
                inside(&["addr", "add", &format!("{pod_ip}/24"), "dev", "dbe2e-pod"]);
            }
            inside(&["link", "set", "dbe2e-pod", "up"]);
            inside(&["link", "set", "lo", "up"]);
        }
    });
}

/// Runs `f` on a thread inside the pod network namespace.
pub fn inside<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    ensure();
    std::thread::spawn(move || {
        let ns = std::fs::File::open(format!("/run/netns/{NETNS}")).expect("the pod network namespace");
        // SAFETY: setns(2) on this (short-lived) thread only, with a valid
        // namespace fd.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("the pod network thread")
}
