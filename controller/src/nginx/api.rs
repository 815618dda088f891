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

#[derive(Clone)]
pub struct ApiClient {
    base: String,
    http: reqwest::Client,
}

impl ApiClient {
    /// `base` is `http://127.0.0.1:10246` (no trailing slash).
    pub fn new(base: &str) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(2))
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
    pub async fn replace_all(&self, backends: &[&Backend]) -> anyhow::Result<()> {
        let body = serde_json::to_vec(backends)?;
        let resp = self
            .http
            .post(format!("{}/configuration/backends", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        check(resp).await.map(drop)
    }

    pub async fn put(&self, backend: &Backend) -> anyhow::Result<()> {
        let resp = self
            .http
            .put(format!("{}/configuration/backends/{}", self.base, backend.name))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(backend)?)
            .send()
            .await?;
        check(resp).await.map(drop)
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

async fn check(resp: reqwest::Response) -> anyhow::Result<Vec<u8>> {
    let status = resp.status();
    let body = resp.bytes().await?.to_vec();
    if !status.is_success() {
        bail!("{status}: {}", String::from_utf8_lossy(&body).trim());
    }
    Ok(body)
}
