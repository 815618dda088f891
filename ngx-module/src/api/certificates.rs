//! The certificate routes of the `/configuration` API: what a write does on
//! the writer thread, and the read-only listings. The handler
//! ([`crate::api::handler`]) routes, reads bodies and answers; this decides
//! the status and body. No answer ever holds a private key.

use lua_compat::api::ErrorBody;
use lua_compat::certificates::{check_id, parse_compat_servers, parse_servers, CertificateBody};

use crate::shm::zone::Zone;
use crate::tls::certificate::prepare;
use crate::tls::store::{apply, list, servers_of, CertChange, CertStoreError};

/// One certificate write, with its body already read.
pub enum CertWrite {
    Put(String, Vec<u8>),
    Delete(String),
    ReplaceServers(Vec<u8>),
    Compat(Vec<u8>),
}

/// The answer to a certificate write.
pub struct CertOutcome {
    pub status: usize,
    pub body: Vec<u8>,
    /// Lines for the error log (warnings such as an expired certificate).
    pub warnings: Vec<String>,
    /// What changed, for the info log; `None` when nothing did.
    pub applied: Option<String>,
}

impl CertOutcome {
    fn error(status: usize, message: &str) -> CertOutcome {
        CertOutcome {
            status,
            body: ErrorBody {
                error: message,
                path: None,
            }
            .to_json(),
            warnings: Vec::new(),
            applied: None,
        }
    }
}

/// Parses, checks and stores one write. Runs on the writer thread.
pub fn run(zone: &Zone, write: CertWrite) -> CertOutcome {
    let mut warnings = Vec::new();
    let (change, what) = match write {
        CertWrite::Put(id, body) => {
            if let Err(e) = check_id(&id) {
                return CertOutcome::error(400, &e);
            }
            let parsed: CertificateBody = match serde_json::from_slice(&body) {
                Ok(b) => b,
                Err(e) => {
                    return CertOutcome::error(400, &format!("body is not {{\"certificate\": PEM, \"key\": PEM}}: {e}"))
                }
            };
            let key = parsed.key.unwrap_or_default();
            match prepare(&id, parsed.certificate.as_bytes(), key.as_bytes()) {
                Ok(p) => {
                    warnings.extend(p.warnings.iter().cloned());
                    (CertChange::Put(p), format!("stored certificate {id:?}"))
                }
                Err(e) => return CertOutcome::error(400, &format!("certificate {id:?}: {e}")),
            }
        }
        CertWrite::Delete(id) => (CertChange::Delete(id.clone()), format!("deleted certificate {id:?}")),
        CertWrite::ReplaceServers(body) => match parse_servers(&body) {
            Ok(map) => {
                let n = map.len();
                (
                    CertChange::ReplaceServers(map),
                    format!("replaced the servers map ({n} hosts)"),
                )
            }
            Err(e) => return CertOutcome::error(400, &e),
        },
        CertWrite::Compat(body) => match parse_compat_servers(&body) {
            Ok((pems, servers)) => {
                let mut certs = Vec::with_capacity(pems.len());
                for (id, pem) in pems {
                    match prepare(&id, pem.as_bytes(), b"") {
                        Ok(p) => {
                            warnings.extend(p.warnings.iter().cloned());
                            certs.push(p);
                        }
                        Err(e) => return CertOutcome::error(400, &format!("certificates[{id:?}]: {e}")),
                    }
                }
                let what = format!("stored {} certificates and {} host changes", certs.len(), servers.len());
                (CertChange::Compat { certs, servers }, what)
            }
            Err(e) => return CertOutcome::error(400, &e),
        },
    };
    let delete = matches!(change, CertChange::Delete(_));
    let put = matches!(change, CertChange::Put(_));
    match apply(zone, change) {
        Ok(a) => CertOutcome {
            status: match () {
                () if delete => 204,
                () if put && !a.created => 200,
                () => 201,
            },
            body: if delete {
                Vec::new()
            } else {
                format!("{{\"generation\":{}}}", a.generation).into_bytes()
            },
            warnings,
            applied: Some(format!("{what}, certificate generation {}", a.generation)),
        },
        Err(CertStoreError::NotFound(id)) => CertOutcome::error(404, &format!("no certificate {id:?}")),
        Err(CertStoreError::InUse { id, hosts }) => CertOutcome::error(
            409,
            &format!(
                "certificate {id:?} is still named by the servers map for {}; change those hosts first",
                hosts.join(", ")
            ),
        ),
        Err(CertStoreError::Unknown { host, id }) => CertOutcome::error(
            409,
            &format!("servers[{host:?}] names certificate {id:?}, which is not stored; PUT it first"),
        ),
        Err(CertStoreError::ZoneFull { needed, zone }) => CertOutcome::error(
            507,
            &format!(
                "dynamic_balancer_zone is full: the change needs {needed} bytes (zone size {zone}); the previous certificates stay in force"
            ),
        ),
    }
}

/// `GET /configuration/certificates` (all) or `.../{id}` (one; `None` if
/// absent).
pub fn listing(zone: &Zone, only: Option<&str>) -> Option<Vec<u8>> {
    let infos = list(zone, only);
    match only {
        None => Some(serde_json::to_vec(&infos).expect("JSON encoding of certificates")),
        Some(_) => infos
            .first()
            .map(|i| serde_json::to_vec(i).expect("JSON encoding of a certificate")),
    }
}

/// `GET /configuration/servers`.
pub fn servers(zone: &Zone) -> Vec<u8> {
    let state = zone.header().certs.read();
    let map = servers_of(state.servers);
    drop(state);
    serde_json::to_vec(&serde_json::json!({ "servers": map })).expect("JSON encoding of servers")
}
