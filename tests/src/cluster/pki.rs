//! The node's certificates, made with openssl for each bring-up: one CA,
//! the apiserver's serving certificate (its node address, the `kubernetes`
//! Service's ClusterIP and names), and a client certificate per component
//! whose name and group the apiserver's built-in RBAC bindings and the Node
//! authorizer expect. No TLS bootstrapping: a single node needs none.

use std::path::Path;

use super::{KUBERNETES_SERVICE_IP, NODE_IP, NODE_NAME};

/// A client identity: file stem, common name (user; the kubelet's gets
/// the node name appended), organization (group).
pub const CLIENTS: [(&str, &str, &str); 6] = [
    ("admin", "kubernetes-admin", "system:masters"),
    ("kubelet", "system:node:", "system:nodes"),
    ("kube-proxy", "system:kube-proxy", ""),
    ("scheduler", "system:kube-scheduler", ""),
    ("controller-manager", "system:kube-controller-manager", ""),
    (
        "apiserver-kubelet-client",
        "kube-apiserver-kubelet-client",
        "system:masters",
    ),
];

fn openssl(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

fn key(dir: &Path, name: &str) -> Result<(), String> {
    openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            &format!("{name}.key"),
        ],
    )
}

fn sign(dir: &Path, name: &str, subject: &str, ext: &str) -> Result<(), String> {
    key(dir, name)?;
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-key",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            subject,
        ],
    )?;
    std::fs::write(dir.join(format!("{name}.ext")), ext).map_err(|e| e.to_string())?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "30",
            "-extfile",
            &format!("{name}.ext"),
        ],
    )
}

/// Writes the CA, the serving and client certificates and the
/// ServiceAccount signing key into `dir`.
pub fn generate(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    key(dir, "ca")?;
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "30",
            "-subj",
            "/CN=dynbal-cluster-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    )?;
    sign(
        dir,
        "apiserver",
        "/CN=kube-apiserver",
        &format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=IP:{NODE_IP},IP:{KUBERNETES_SERVICE_IP},IP:127.0.0.1,\
             DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,\
             DNS:kubernetes.default.svc.cluster.local,DNS:localhost\n"
        ),
    )?;
    for (name, cn, org) in CLIENTS {
        let cn = if name == "kubelet" {
            format!("{cn}{NODE_NAME}")
        } else {
            cn.to_string()
        };
        let subject = if org.is_empty() {
            format!("/CN={cn}")
        } else {
            format!("/O={org}/CN={cn}")
        };
        sign(
            dir,
            name,
            &subject,
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
        )?;
    }
    key(dir, "sa")?;
    openssl(dir, &["pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"])
}
