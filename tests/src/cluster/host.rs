//! What the node changes on the machine, and how it is put back.
//!
//! Before anything starts, [`prepare`] records what a node will change
//! (writable sysctls under kernel, vm and net, the iptables rule sets, the
//! root mount's propagation) in the run directory, then makes the changes
//! a node needs: `/` shared (mount propagation for volumes), IPv4
//! forwarding, the pod bridge with the node address, the Service range
//! routed onto the bridge, and a guard chain that keeps every Pod and
//! Service packet on this machine. [`restore`] undoes all of it from the
//! record, so it works after a crash too (the record is on disk).
//!
//! The guard, in the filter table:
//! - FORWARD: a forwarded packet that does not leave through the bridge is
//!   dropped (this machine forwards nothing else; `ip_forward` was 0), so
//!   no Pod reaches the uplink, whatever its route or a Service says.
//! - INPUT: the node range is reachable from the bridge and loopback only.
//! - OUTPUT: the host sends to the node range through the bridge or
//!   loopback only.
//!
//! Un-proxied ClusterIPs are routed onto the bridge (not blackholed: a
//! locally sent packet is routed before kube-proxy's OUTPUT DNAT, and a
//! blackhole route would refuse it there), where nothing answers for them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{BRIDGE, LB_POOL, NODE_IP, NODE_RANGE, SERVICE_CIDR};

const GUARD: &str = "DYNBAL-CLUSTER-GUARD";

/// The directories of /proc/sys whose files are recorded and restored
/// (kubelet writes kernel and vm keys, kube-proxy and the CNI net ones).
const SYSCTL_TREES: [&str; 9] = [
    "kernel",
    "kernel/keys",
    "vm",
    "net/ipv4",
    "net/ipv4/conf/all",
    "net/ipv4/conf/default",
    "net/ipv6/conf/all",
    "net/bridge",
    "net/netfilter",
];

/// Paths a node's daemons create outside the run directory whatever they
/// are told (containerd's shim sockets and runc state, kubelet's log
/// links, ...): those absent before bring-up are removed at teardown.
const STRAY_PATHS: [&str; 10] = [
    "/run/containerd",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/kubelet",
    "/etc/kubernetes",
    "/var/lib/cni",
    "/run/netns",
    "/etc/cni",
    "/opt/cni",
    "/run/kubernetes",
];

/// Values that change by themselves, never restored.
const VOLATILE: [&str; 3] = ["kernel/ns_last_pid", "kernel/random", "kernel/hostname"];

fn cmd(program: &str, args: &[&str]) -> Result<String, String> {
    super::run(Command::new(program).args(args))
}

/// Every writable sysctl of [`SYSCTL_TREES`] and its value.
pub fn sysctls() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for tree in SYSCTL_TREES {
        let dir = Path::new("/proc/sys").join(tree);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            use std::os::unix::fs::PermissionsExt;
            if !meta.is_file() || meta.permissions().mode() & 0o200 == 0 {
                continue;
            }
            let key = path.strip_prefix("/proc/sys").unwrap().display().to_string();
            if VOLATILE.iter().any(|v| key.starts_with(v)) {
                continue;
            }
            if let Ok(v) = std::fs::read_to_string(&path) {
                out.insert(key, v.trim().to_string());
            }
        }
    }
    out
}

fn write_sysctl(key: &str, value: &str) -> Result<(), String> {
    std::fs::write(Path::new("/proc/sys").join(key), value).map_err(|e| format!("sysctl {key}: {e}"))
}

fn root_is_shared() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            f.len() > 6
                && f[4] == "/"
                && f[6..]
                    .iter()
                    .take_while(|x| **x != "-")
                    .any(|x| x.starts_with("shared:"))
        })
}

/// What [`prepare`] found, written to the run directory.
#[derive(Default)]
struct Record {
    sysctls: BTreeMap<String, String>,
    iptables: String,
    ip6tables: String,
    root_shared: bool,
    /// [`STRAY_PATHS`] that did not exist.
    absent: Vec<String>,
}

fn record_dir(run: &Path) -> PathBuf {
    run.join("host-record")
}

impl Record {
    fn save(&self, run: &Path) -> Result<(), String> {
        let d = record_dir(run);
        std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        let sysctls: String = self.sysctls.iter().map(|(k, v)| format!("{k}\t{v}\n")).collect();
        std::fs::write(d.join("sysctls"), sysctls).map_err(|e| e.to_string())?;
        std::fs::write(d.join("iptables"), &self.iptables).map_err(|e| e.to_string())?;
        std::fs::write(d.join("ip6tables"), &self.ip6tables).map_err(|e| e.to_string())?;
        std::fs::write(d.join("absent"), self.absent.join("\n")).map_err(|e| e.to_string())?;
        std::fs::write(d.join("root-shared"), if self.root_shared { "1" } else { "0" }).map_err(|e| e.to_string())
    }

    fn load(run: &Path) -> Option<Record> {
        let d = record_dir(run);
        let sysctls = std::fs::read_to_string(d.join("sysctls")).ok()?;
        Some(Record {
            sysctls: sysctls
                .lines()
                .filter_map(|l| l.split_once('\t'))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            iptables: std::fs::read_to_string(d.join("iptables")).unwrap_or_default(),
            ip6tables: std::fs::read_to_string(d.join("ip6tables")).unwrap_or_default(),
            root_shared: std::fs::read_to_string(d.join("root-shared")).ok()?.trim() == "1",
            absent: std::fs::read_to_string(d.join("absent"))
                .unwrap_or_default()
                .lines()
                .map(str::to_string)
                .collect(),
        })
    }
}

/// Records the machine's state in `run`, then makes the changes a node
/// needs.
pub fn prepare(run: &Path) -> Result<(), String> {
    let record = Record {
        sysctls: sysctls(),
        iptables: cmd("iptables-save", &[])?,
        ip6tables: cmd("ip6tables-save", &[])?,
        root_shared: root_is_shared(),
        absent: STRAY_PATHS
            .iter()
            .filter(|p| !Path::new(p).exists())
            .map(|p| p.to_string())
            .collect(),
    };
    record.save(run)?;

    cmd("mount", &["--make-rshared", "/"])?;
    write_sysctl("net/ipv4/ip_forward", "1")?;

    cmd("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
    cmd("ip", &["addr", "add", &format!("{NODE_IP}/24"), "dev", BRIDGE])?;
    cmd("ip", &["link", "set", BRIDGE, "up"])?;
    cmd("ip", &["route", "add", SERVICE_CIDR, "dev", BRIDGE, "src", NODE_IP])?;
    cmd("ip", &["route", "add", LB_POOL, "dev", BRIDGE, "src", NODE_IP])?;

    let ipt = |args: &[&str]| cmd("iptables", &[&["-w"], args].concat());
    ipt(&["-N", GUARD])?;
    // Anything forwarded must go out through the bridge.
    ipt(&["-A", GUARD, "-o", BRIDGE, "-j", "RETURN"])?;
    ipt(&["-A", GUARD, "-j", "DROP"])?;
    ipt(&["-I", "FORWARD", "1", "-j", GUARD])?;
    ipt(&["-I", "INPUT", "1", "-d", NODE_RANGE, "!", "-i", BRIDGE, "-j", "DROP"])?;
    ipt(&["-I", "INPUT", "1", "-d", NODE_RANGE, "-i", "lo", "-j", "ACCEPT"])?;
    ipt(&["-I", "OUTPUT", "1", "-d", NODE_RANGE, "!", "-o", BRIDGE, "-j", "DROP"])?;
    ipt(&["-I", "OUTPUT", "1", "-d", NODE_RANGE, "-o", "lo", "-j", "ACCEPT"])?;
    Ok(())
}

/// Packets the guard dropped on their way out of the node (the FORWARD
/// rule's counter).
pub fn guard_drops() -> u64 {
    let out = cmd("iptables", &["-w", "-L", GUARD, "-v", "-x", "-n"]).unwrap_or_default();
    out.lines()
        .filter(|l| l.contains("DROP"))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Restores an iptables family from its record: every table the record
/// has is replaced by its recorded rules; a table it lacks is emptied
/// (what a node added there, kube-proxy's and kubelet's chains, goes).
fn restore_iptables(restore: &str, save: &str, recorded: &str) -> Result<(), String> {
    let now = cmd(save, &[]).unwrap_or_default();
    let tables_now: Vec<String> = now
        .lines()
        .filter_map(|l| l.strip_prefix('*'))
        .map(str::to_string)
        .collect();
    let mut input = recorded.to_string();
    for t in tables_now {
        if !recorded.lines().any(|l| l.strip_prefix('*') == Some(t.as_str())) {
            input.push_str(&format!("*{t}\nCOMMIT\n"));
        }
    }
    let mut child = Command::new(restore)
        .arg("-w")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{restore}: {e}"))?;
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("{restore}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// Mount points at or under `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Unmounts everything under `dir` (volumes, container root filesystems,
/// network namespaces), deepest first.
pub fn unmount_all(dir: &Path) {
    for _ in 0..3 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return;
        }
        for m in mounts {
            // SAFETY: umount2(2) with a NUL-terminated path we own.
            let c = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()).unwrap();
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Removes the cgroups kubelet made (`kubepods` in every hierarchy),
/// deepest first. Their processes must be gone.
pub fn remove_cgroups() -> Vec<String> {
    let mut left = Vec::new();
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return left;
    };
    // Every v1 hierarchy, and v2's root.
    let roots = hierarchies
        .flatten()
        .map(|h| h.path())
        .chain(std::iter::once(PathBuf::from("/sys/fs/cgroup")));
    for h in roots {
        let root = h.join("kubepods");
        if !root.exists() {
            continue;
        }
        let mut dirs = Vec::new();
        collect_dirs(&root, &mut dirs);
        dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for d in dirs {
            if std::fs::remove_dir(&d).is_err() && d.exists() {
                left.push(d.display().to_string());
            }
        }
    }
    left
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

/// Every process in kubelet's cgroups (the containers), for killing.
pub fn pod_processes() -> Vec<i32> {
    let mut pids = Vec::new();
    // cgroup v1 hierarchies, then v2's single tree.
    for h in ["pids", "memory", "cpu,cpuacct", "freezer", ""] {
        let root = Path::new("/sys/fs/cgroup").join(h).join("kubepods");
        let mut dirs = Vec::new();
        if root.exists() {
            collect_dirs(&root, &mut dirs);
        }
        for d in dirs {
            for l in std::fs::read_to_string(d.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
            {
                if let Ok(p) = l.trim().parse() {
                    pids.push(p);
                }
            }
        }
    }
    pids.sort();
    pids.dedup();
    pids
}

/// Puts the machine back as [`prepare`] found it. Every step is tried;
/// the failures are returned.
pub fn restore(run: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    let record = Record::load(run);
    let _ = cmd("ip", &["route", "del", SERVICE_CIDR]);
    let _ = cmd("ip", &["route", "del", LB_POOL]);
    if Path::new("/sys/class/net").join(BRIDGE).exists() {
        if let Err(e) = cmd("ip", &["link", "del", BRIDGE]) {
            errors.push(e);
        }
    }
    // Host ends of Pod veths whose namespaces outlived their Pods.
    if let Ok(links) = std::fs::read_dir("/sys/class/net") {
        for l in links.flatten() {
            let master = l.path().join("master");
            if std::fs::read_link(&master)
                .map(|m| m.file_name().map(|f| f == BRIDGE).unwrap_or(false))
                .unwrap_or(false)
            {
                let _ = cmd("ip", &["link", "del", &l.file_name().to_string_lossy()]);
            }
        }
    }
    let Some(record) = record else {
        return errors;
    };
    if let Err(e) = restore_iptables("iptables-restore", "iptables-save", &record.iptables) {
        errors.push(e);
    }
    if let Err(e) = restore_iptables("ip6tables-restore", "ip6tables-save", &record.ip6tables) {
        errors.push(e);
    }
    let now = sysctls();
    for (k, v) in &record.sysctls {
        if now.get(k) != Some(v) {
            if let Err(e) = write_sysctl(k, v) {
                errors.push(e);
            }
        }
    }
    for p in &record.absent {
        let path = Path::new(p);
        if path.exists() {
            unmount_all(path);
            if let Err(e) = std::fs::remove_dir_all(path) {
                errors.push(format!("{p}: {e}"));
            }
        }
    }
    if !record.root_shared {
        if let Err(e) = cmd("mount", &["--make-rprivate", "/"]) {
            errors.push(e);
        }
    }
    errors
}

/// Sysctls that differ from the record (after [`restore`]: none).
pub fn sysctl_changes(run: &Path) -> Vec<String> {
    let Some(record) = Record::load(run) else {
        return vec![];
    };
    let now = sysctls();
    record
        .sysctls
        .iter()
        .filter(|(k, v)| now.get(*k).is_some_and(|n| n != *v))
        .map(|(k, v)| format!("{k}: {v} -> {}", now[k]))
        .collect()
}
