//! A real nginx master process with the module, under a temporary prefix.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::process::{prefix_with, NginxProcess};
use crate::{agent, free_port};

/// How long any wait in the harness may take.
const PATIENCE: Duration = Duration::from_secs(15);

/// An HTTP answer, read whole.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// Builds the nginx.conf of a test. The traffic server's location takes its
/// backend name from the `X-Backend` request header, so one nginx can serve
/// every backend a test needs.
pub struct NginxBuilder {
    workers: usize,
    zone: Option<String>,
    upstream_extra: String,
    balancer_directive: String,
    location_extra: String,
    api_extra: String,
    http_extra: String,
    main_extra: String,
    api_token: Option<String>,
    /// The token the harness sends, when the configuration sets it itself
    /// (a token file, say).
    harness_token: Option<String>,
}

impl Default for NginxBuilder {
    fn default() -> Self {
        NginxBuilder {
            workers: 1,
            zone: None,
            upstream_extra: "keepalive 16;".into(),
            balancer_directive: "dynamic_balancer;".into(),
            location_extra: String::new(),
            api_extra: "client_max_body_size 21m; client_body_buffer_size 21m;".into(),
            http_extra: String::new(),
            main_extra: String::new(),
            api_token: None,
            harness_token: None,
        }
    }
}

impl NginxBuilder {
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    pub fn zone(mut self, size: &str) -> Self {
        self.zone = Some(size.into());
        self
    }

    /// Directives after `dynamic_balancer` in `upstream{}` (default `keepalive 16;`).
    pub fn upstream_extra(mut self, s: &str) -> Self {
        self.upstream_extra = s.into();
        self
    }

    /// The balancer line itself (default `dynamic_balancer;`).
    pub fn balancer_directive(mut self, s: &str) -> Self {
        self.balancer_directive = s.into();
        self
    }

    pub fn location_extra(mut self, s: &str) -> Self {
        self.location_extra = s.into();
        self
    }

    /// Directives in the API location (default: 21m body limit and buffer).
    pub fn api_extra(mut self, s: &str) -> Self {
        self.api_extra = s.into();
        self
    }

    pub fn http_extra(mut self, s: &str) -> Self {
        self.http_extra = s.into();
        self
    }

    /// Directives in the main context (e.g. `worker_shutdown_timeout`).
    pub fn main_extra(mut self, s: &str) -> Self {
        self.main_extra = s.into();
        self
    }

    /// Starts nginx whose configuration sets the API token itself; the
    /// harness sends `token`.
    pub fn start_with_token(mut self, token: &str) -> Nginx {
        self.harness_token = Some(token.into());
        self.start()
    }

    /// Protects the API with `dynamic_balancer_api_token`; the harness's
    /// own API calls then send it.
    pub fn api_token(mut self, token: &str) -> Self {
        self.api_token = Some(token.into());
        self
    }

    fn render(&self, port: u16, api_port: u16) -> String {
        let zone = self
            .zone
            .as_ref()
            .map(|z| format!("dynamic_balancer_zone {z};"))
            .unwrap_or_default();
        format!(
            r#"worker_processes {workers};
{main_extra}
events {{ worker_connections 512; }}
http {{
    access_log off;
    {zone}
    {http_extra}
    upstream upstream_balancer {{
        server 0.0.0.1;
        {balancer}
        {upstream_extra}
    }}
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            set $proxy_upstream_name $http_x_backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_connect_timeout 2s;
            proxy_next_upstream error timeout;
            add_header X-Upstream-Addr $upstream_addr always;
            add_header X-Upstream-Status $upstream_status always;
            add_header X-Pid $pid always;
            {location_extra}
            proxy_pass http://upstream_balancer;
        }}
        location = /not-proxied {{ return 200 "plain\n"; }}
    }}
    server {{
        listen 127.0.0.1:{api_port};
        location /configuration {{
            {api_extra}
            dynamic_balancer_api;
        }}
    }}
}}
"#,
            workers = self.workers,
            http_extra = self.http_extra,
            main_extra = self.main_extra,
            balancer = self.balancer_directive,
            upstream_extra = self.upstream_extra,
            location_extra = self.location_extra,
            api_extra = match &self.api_token {
                Some(t) => format!("{} dynamic_balancer_api_token {t};", self.api_extra),
                None => self.api_extra.clone(),
            },
        )
    }

    /// Writes the configuration without starting nginx, for `nginx -t` tests.
    pub fn test_config(self) -> Output {
        let dir = prefix_with(&self.render(free_port(), free_port()));
        crate::nginx_command(dir.path()).arg("-t").output().unwrap()
    }

    /// Starts nginx and waits until every worker reports in `/configuration/status`.
    pub fn start(self) -> Nginx {
        let (port, api_port) = (free_port(), free_port());
        let nginx = Nginx {
            process: NginxProcess::spawn(&self.render(port, api_port)),
            port,
            api_port,
            workers: self.workers,
            token: self.api_token.clone().or(self.harness_token.clone()),
        };
        nginx.wait_for_workers(&BTreeSet::new());
        nginx
    }
}

/// A running nginx; stopped with SIGQUIT, then SIGKILL, when dropped.
pub struct Nginx {
    process: NginxProcess,
    pub port: u16,
    pub api_port: u16,
    workers: usize,
    /// The API token the harness sends, if the API has one.
    token: Option<String>,
}

fn read(result: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Response {
    let mut r = result.unwrap_or_else(|e| panic!("HTTP request failed: {e}"));
    let headers = r
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_ascii_lowercase(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let body = r.body_mut().read_to_string().unwrap_or_default();
    Response {
        status: r.status().as_u16(),
        headers,
        body,
    }
}

impl Nginx {
    pub fn builder() -> NginxBuilder {
        NginxBuilder::default()
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn prefix(&self) -> PathBuf {
        self.process.prefix().to_path_buf()
    }

    pub fn error_log(&self) -> String {
        self.process.error_log()
    }

    /// A proxied request for backend `backend` (sent as `X-Backend`).
    pub fn get(&self, backend: &str) -> Response {
        read(
            agent()
                .get(&format!("http://127.0.0.1:{}/", self.port))
                .header("X-Backend", backend)
                .call(),
        )
    }

    pub fn get_path(&self, path: &str) -> Response {
        read(agent().get(&format!("http://127.0.0.1:{}{path}", self.port)).call())
    }

    /// A request to the configuration API (with the token, if it has one).
    pub fn api(&self, method: &str, path: &str, body: Option<&str>) -> Response {
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        self.api_as(method, path, body, &headers)
    }

    /// A request to the configuration API with exactly these extra headers.
    pub fn api_as(&self, method: &str, path: &str, body: Option<&str>, headers: &[(&str, &str)]) -> Response {
        let url = format!("http://127.0.0.1:{}{path}", self.api_port);
        let mut req = ureq::http::Request::builder().method(method).uri(&url);
        if body.is_some() {
            req = req.header("Content-Type", "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        read(agent().run(req.body(body.unwrap_or("").to_string()).unwrap()))
    }

    pub fn post_backends(&self, backends: &Value) -> Response {
        self.api("POST", "/configuration/backends", Some(&backends.to_string()))
    }

    pub fn status(&self) -> Value {
        let r = self.api("GET", "/configuration/status", None);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    }

    fn worker_pids(&self) -> BTreeSet<i64> {
        match self.try_status() {
            Some(s) => s["workers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w["pid"].as_i64().unwrap())
                .collect(),
            None => BTreeSet::new(),
        }
    }

    fn try_status(&self) -> Option<Value> {
        let url = format!("http://127.0.0.1:{}/configuration/status", self.api_port);
        let mut req = agent().get(&url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        let mut r = req.call().ok()?;
        serde_json::from_str(&r.body_mut().read_to_string().ok()?).ok()
    }

    /// Waits until `workers` live workers report, none of them in `old`.
    fn wait_for_workers(&self, old: &BTreeSet<i64>) -> BTreeSet<i64> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let pids: BTreeSet<i64> = self
                .worker_pids()
                .into_iter()
                .filter(|p| !old.contains(p) && process_alive(*p))
                .collect();
            if pids.len() == self.workers {
                return pids;
            }
            assert!(
                Instant::now() < deadline,
                "workers did not come up; error log:\n{}",
                self.error_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `nginx -s reload` (SIGHUP to the master); returns once a new set of
    /// workers reports and the old ones are gone.
    pub fn reload(&self) -> BTreeSet<i64> {
        let old = self.worker_pids();
        signal(self.pid() as i64, libc::SIGHUP);
        let new = self.wait_for_workers(&old);
        let deadline = Instant::now() + PATIENCE;
        while old.iter().any(|p| process_alive(*p)) {
            assert!(
                Instant::now() < deadline,
                "old workers did not exit; error log:\n{}",
                self.error_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        new
    }

    /// Waits until every worker reports `generation`.
    pub fn wait_generation(&self, generation: u64) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let s = self.status();
            let workers = s["workers"].as_array().unwrap();
            if workers.iter().filter(|w| w["generation"] == generation).count() >= self.workers {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "workers never reached generation {generation}: {s}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn signal(pid: i64, sig: i32) {
    // SAFETY: kill(2) on a pid we started.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

fn process_alive(pid: i64) -> bool {
    // SAFETY: signal 0 only checks existence.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

impl Nginx {
    /// SIGKILL to the master and every worker (a crash), waiting until
    /// they are gone.
    pub fn kill_all(&mut self) {
        self.process.kill_all();
    }

    /// Starts nginx again after [`Nginx::kill_all`], on the same prefix,
    /// configuration and ports, without waiting for it to listen.
    pub fn respawn(&mut self) {
        crate::process::wait_released(&[self.port, self.api_port], PATIENCE);
        self.process.respawn();
    }

    /// [`Nginx::respawn`], then waits until every worker reports.
    pub fn restart(&mut self) {
        self.respawn();
        crate::process::wait_listening(self.api_port, PATIENCE);
        self.wait_for_workers(&BTreeSet::new());
    }

    /// SIGQUIT (graceful shutdown) and the master's exit status, if it
    /// exits within `timeout`.
    pub fn quit_and_wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        signal(self.pid() as i64, libc::SIGQUIT);
        self.process.wait_exit(timeout)
    }
}

impl Nginx {
    /// A proxied request with extra request headers.
    pub fn get_with(&self, headers: &[(&str, &str)]) -> Response {
        self.get_path_with("/", headers)
    }

    /// A proxied request for `path` with extra request headers.
    pub fn get_path_with(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut req = agent().get(&format!("http://127.0.0.1:{}{path}", self.port));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        read(req.call())
    }
}

impl Nginx {
    /// A plain GET to another port of this nginx (a server from `http_extra`).
    pub fn get_port(&self, port: u16, path: &str) -> Response {
        read(agent().get(&format!("http://127.0.0.1:{port}{path}")).call())
    }
}
