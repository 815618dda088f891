//! The certificate nginx serves when the module's zone names none for a
//! handshake (no `--default-ssl-certificate`, or before the first push):
//! a self-signed one made at start, as ingress-nginx's "Kubernetes Ingress
//! Controller Fake Certificate". It is the static `ssl_certificate` of
//! every TLS server, which also keeps `nginx -t` valid with an empty zone.
//!
//! It is the only key the controller writes to disk, and it is its own:
//! tenants' keys go to the module's shared memory only.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::token::write_private;

/// File name under the ssl directory (chain and key in one PEM).
pub const FILE: &str = "default-fake-certificate.pem";

/// Its subject CN, ingress-nginx's.
pub const COMMON_NAME: &str = "Kubernetes Ingress Controller Fake Certificate";

/// Makes the ssl directory (0700) and a fresh default certificate in it
/// (0600), and removes certificate files older versions wrote there.
/// Returns the certificate's path.
pub fn ensure(ssl_dir: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(ssl_dir)
        .with_context(|| format!("creating {}", ssl_dir.display()))?;
    std::fs::set_permissions(ssl_dir, std::fs::Permissions::from_mode(0o700))?;
    if let Ok(entries) = std::fs::read_dir(ssl_dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.ends_with(".pem") && name != FILE {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let path = ssl_dir.join(FILE);
    write_private(&path, generate()?.as_bytes())?;
    Ok(path)
}

/// A self-signed ECDSA P-256 certificate for `ingress.local`, valid a
/// year (a new one is made at every start).
pub fn generate() -> anyhow::Result<String> {
    use rcgen::{CertificateParams, DnType, KeyPair};
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["ingress.local".to_string()])?;
    params.distinguished_name.push(DnType::CommonName, COMMON_NAME);
    params.distinguished_name.push(DnType::OrganizationName, "Acme Co");
    let now = std::time::SystemTime::now();
    params.not_before = (now - std::time::Duration::from_secs(3600)).into();
    params.not_after = (now + std::time::Duration::from_secs(365 * 24 * 3600)).into();
    let cert = params.self_signed(&key)?;
    Ok(format!("{}{}", cert.pem(), key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_file_that_openssl_loads_and_old_secrets_removed() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ssl");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("team-a-web-0123.pem"), "old").unwrap();
        let path = ensure(&dir).unwrap();
        assert!(!dir.join("team-a-web-0123.pem").exists());
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let pem = std::fs::read(&path).unwrap();
        let checked = crate::model::tls::check(&pem, &pem).unwrap();
        assert!(checked.warnings.is_empty());
        let cert = openssl::x509::X509::from_pem(&pem).unwrap();
        let cn = cert
            .subject_name()
            .entries_by_nid(openssl::nid::Nid::COMMONNAME)
            .next()
            .unwrap()
            .data()
            .to_string()
            .unwrap();
        assert_eq!(cn, COMMON_NAME);
    }
}
