//! The node's configuration files, written into the run directory: the
//! kubeconfigs, containerd's, kubelet's, kube-proxy's and the CNI network.
//! Every address comes from the node range (RFC 2544's benchmarking block),
//! every path from the run directory, so nothing of the machine's own
//! (`/etc/cni`, `/var/lib/kubelet`, `/run/containerd`) is touched.

use std::path::Path;

use super::{Layout, BRIDGE, CLUSTER_DNS_IP, NODE_IP, NODE_NAME, PAUSE_IMAGE, POD_CIDR, POD_GATEWAY};

fn write(path: &Path, text: &str) -> Result<(), String> {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// A kubeconfig for the client certificate `name` of the PKI directory.
pub fn kubeconfig(l: &Layout, name: &str) -> String {
    let pki = l.pki();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: dynbal\n  cluster:\n    server: https://{NODE_IP}:6443\n    \
         certificate-authority: {ca}\nusers:\n- name: {name}\n  user:\n    client-certificate: {crt}\n    \
         client-key: {key}\ncontexts:\n- name: dynbal\n  context:\n    cluster: dynbal\n    user: {name}\n    \
         namespace: default\ncurrent-context: dynbal\n",
        ca = pki.join("ca.crt").display(),
        crt = pki.join(format!("{name}.crt")).display(),
        key = pki.join(format!("{name}.key")).display(),
    )
}

/// Writes every file the daemons read.
pub fn write_all(l: &Layout) -> Result<(), String> {
    for name in ["admin", "kubelet", "kube-proxy", "scheduler", "controller-manager"] {
        write(&l.kubeconfig(name), &kubeconfig(l, name))?;
    }
    let bin = l.bin.display();
    let run = l.run.display();
    // containerd 2.x (config version 3): everything under the run
    // directory, cgroupfs (no systemd here), the pause image built from
    // catatonit, the CNI plugins from the tier's cache. Network namespaces
    // under the state directory, so teardown finds them there.
    write(
        &l.run.join("containerd.toml"),
        &format!(
            r#"version = 3
root = '{run}/containerd'
state = '{run}/containerd-state'

[grpc]
  address = '{sock}'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{PAUSE_IMAGE}'

[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  enable_cdi = false
  # These VMs give root no CAP_SYS_RESOURCE: an oom_score_adj below
  # containerd's own (the sandbox's -998, Guaranteed Pods' -997) fails
  # runc's init. Clamp it, as a rootless node does.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = '{bin}/runc'
    Root = '{run}/runc'
    SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{cni}']
    conf_dir = '{run}/cni/net.d'
    use_internal_loopback = true

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '{NODE_IP}'
"#,
            sock = l.containerd_socket().display(),
            cni = l.cni_bin.display(),
        ),
    )?;
    // The bridge exists already (host::prepare gave it the node address);
    // no masquerade: Pod traffic never leaves the node.
    write(
        &l.run.join("cni/net.d/10-dynbal.conflist"),
        &format!(
            r#"{{
  "cniVersion": "1.0.0",
  "name": "dynbal",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "{BRIDGE}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "dataDir": "{run}/cni/ipam",
        "ranges": [[{{"subnet": "{POD_CIDR}", "gateway": "{POD_GATEWAY}"}}]],
        "routes": [{{"dst": "0.0.0.0/0"}}]
      }}
    }},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
  ]
}}
"#
        ),
    )?;
    // DNS: Pods get the cluster DNS address, where nothing answers (the
    // Service range is routed onto the bridge): no query leaves the node.
    write(&l.run.join("resolv.conf"), &format!("nameserver {CLUSTER_DNS_IP}\n"))?;
    write(
        &l.run.join("kubelet.yaml"),
        &format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://{sock}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
address: {NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: {NODE_IP}
healthzPort: 10248
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
clusterDomain: cluster.local
clusterDNS: [{CLUSTER_DNS_IP}]
resolvConf: {run}/resolv.conf
podLogsDir: {run}/pod-logs
evictionHard: {{memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
nodeStatusUpdateFrequency: 5s
syncFrequency: 20s
rotateCertificates: false
serverTLSBootstrap: false
"#,
            sock = l.containerd_socket().display(),
            ca = l.pki().join("ca.crt").display(),
        ),
    )?;
    // kube-proxy, iptables mode: NodePorts on the node address only (no
    // route_localnet), conntrack sysctls left alone.
    write(
        &l.run.join("kube-proxy.yaml"),
        &format!(
            r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kc}
mode: iptables
hostnameOverride: {NODE_NAME}
bindAddress: {NODE_IP}
healthzBindAddress: {NODE_IP}:10256
metricsBindAddress: {NODE_IP}:10249
clusterCIDR: {POD_CIDR}
nodePortAddresses: [{NODE_IP}/32]
iptables:
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#,
            kc = l.kubeconfig("kube-proxy").display(),
        ),
    )?;
    Ok(())
}
