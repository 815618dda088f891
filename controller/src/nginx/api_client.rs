//! A client for the module's `/configuration` API.

use std::time::Duration;

use anyhow::{bail, Context as _};
use lua_compat::wire::Backend;
use serde::Deserialize;

/// `GET /configuration/status`, the fields the controller reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Status {
    pub generation: u64,
    #[serde(default)]
    pub workers: Vec<WorkerStatus>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WorkerStatus {
    pub pid: u32,
    pub generation: u64,
}

/// One entry of `GET /configuration/certificates`, as far as the pusher
/// cares.
#[derive(Debug, Clone, Deserialize)]
pub struct HeldCertificate {
    pub id: String,
    pub sha256: String,
    pub chain: usize,
}

#[derive(Clone)]
pub struct ApiClient {
    base: String,
    http: reqwest::Client,
}

/// Why a push failed.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// The module refused the body (400, 413): sending it again cannot help.
    #[error("{status}: {body}")]
    Refused { status: u16, body: String },
    /// Anything else (no connection, a 5xx, a 507 full zone): worth a retry.
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

impl ApiClient {
    /// `base` is `http://127.0.0.1:10246` (no trailing slash). With a
    /// token, every request carries `Authorization: Bearer <token>`.
    pub fn new(base: &str, token: Option<String>) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token {
            let mut value =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).expect("a printable token");
            // Keeps the token out of any debug output of the client.
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(2))
            // A connection per call: a reload's old workers close their idle
            // connections, and a pooled one would fail the next push. On
            // loopback a connect costs microseconds.
            .pool_max_idle_per_host(0)
            .default_headers(headers)
            .build()
            .expect("a plain HTTP client builds");
        ApiClient {
            base: base.trim_end_matches('/').to_string(),
            http,
        }
    }

    pub async fn status(&self) -> anyhow::Result<Status> {
        let resp = self
            .http
            .get(format!("{}/configuration/status", self.base))
            .send()
            .await?;
        let bytes = check(resp).await?;
        serde_json::from_slice(&bytes).context("decoding /configuration/status")
    }

    /// Replaces every backend in one atomic write.
    pub async fn replace_all(&self, backends: &[&Backend]) -> Result<(), PushError> {
        let body = serde_json::to_vec(backends).map_err(anyhow::Error::from)?;
        let resp = self
            .http
            .post(format!("{}/configuration/backends", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(anyhow::Error::from)?;
        refusal(resp).await
    }

    pub async fn put(&self, backend: &Backend) -> Result<(), PushError> {
        let resp = self
            .http
            .put(format!("{}/configuration/backends/{}", self.base, backend.name))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(backend).map_err(anyhow::Error::from)?)
            .send()
            .await
            .map_err(anyhow::Error::from)?;
        refusal(resp).await
    }

    /// Deleting a backend that is already gone is success.
    pub async fn delete(&self, name: &str) -> anyhow::Result<()> {
        let resp = self
            .http
            .delete(format!("{}/configuration/backends/{name}", self.base))
            .send()
            .await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(());
        }
        check(resp).await.map(drop)
    }
}

/// A 400 or 413 is a refusal of this body; anything else (401 while an
/// external nginx still has an older token, 507, a 5xx) is a failure.
impl ApiClient {
    /// `PUT /configuration/certificates/{id}`: a chain and its key, PEM.
    pub async fn put_certificate(&self, id: &str, chain: &str, key: &str) -> Result<(), PushError> {
        let body = serde_json::json!({ "certificate": chain, "key": key });
        let resp = self
            .http
            .put(format!("{}/configuration/certificates/{id}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(anyhow::Error::from)?;
        refusal(resp).await
    }

    /// `DELETE /configuration/certificates/{id}`; an absent one is fine.
    pub async fn delete_certificate(&self, id: &str) -> anyhow::Result<()> {
        let resp = self
            .http
            .delete(format!("{}/configuration/certificates/{id}", self.base))
            .send()
            .await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(());
        }
        check(resp).await.map(drop)
    }

    /// `PUT /configuration/servers`: the whole host → certificate id map.
    pub async fn put_servers(&self, servers: &std::collections::BTreeMap<String, String>) -> Result<(), PushError> {
        let resp = self
            .http
            .put(format!("{}/configuration/servers", self.base))
            .header("content-type", "application/json")
            .body(serde_json::json!({ "servers": servers }).to_string())
            .send()
            .await
            .map_err(anyhow::Error::from)?;
        refusal(resp).await
    }

    /// `PUT /configuration/routes`: the whole Gateway API route table.
    pub async fn put_routes(&self, table: &lua_compat::routes::RouteTable) -> Result<(), PushError> {
        let body = serde_json::to_string(table).map_err(anyhow::Error::from)?;
        let resp = self
            .http
            .put(format!("{}/configuration/routes", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(anyhow::Error::from)?;
        refusal(resp).await
    }

    /// The certificates the module holds: id, leaf SHA-256, chain length.
    pub async fn certificates(&self) -> anyhow::Result<Vec<HeldCertificate>> {
        let resp = self
            .http
            .get(format!("{}/configuration/certificates", self.base))
            .send()
            .await?;
        let bytes = check(resp).await?;
        serde_json::from_slice(&bytes).context("decoding /configuration/certificates")
    }

    /// The module's request metrics (Prometheus text), within `timeout`:
    /// a scrape must not hang on a busy nginx.
    /// The module's request metrics, with `status` as classes (`2xx`) when
    /// `classes`.
    pub async fn metrics(&self, timeout: Duration, classes: bool) -> anyhow::Result<String> {
        let query = if classes { "?status=class" } else { "" };
        let resp = self
            .http
            .get(format!("{}/configuration/metrics{query}", self.base))
            .timeout(timeout)
            .send()
            .await?;
        let bytes = check(resp).await?;
        String::from_utf8(bytes).context("decoding /configuration/metrics")
    }
}

async fn refusal(resp: reqwest::Response) -> Result<(), PushError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let body = resp.bytes().await.map_err(anyhow::Error::from)?;
    let body = String::from_utf8_lossy(&body).trim().to_string();
    if matches!(status.as_u16(), 400 | 413) {
        return Err(PushError::Refused {
            status: status.as_u16(),
            body,
        });
    }
    Err(PushError::Failed(anyhow::anyhow!("{status}: {body}")))
}

async fn check(resp: reqwest::Response) -> anyhow::Result<Vec<u8>> {
    let status = resp.status();
    let body = resp.bytes().await?.to_vec();
    if !status.is_success() {
        bail!("{status}: {}", String::from_utf8_lossy(&body).trim());
    }
    Ok(body)
}
