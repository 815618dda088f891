//! The subcommands: inspection of a running controller (through its local
//! endpoints and files) and the webhook's one-shot certificate jobs. The
//! formatting lives in the library's [`controller::inspect`].

use anyhow::Context as _;
use controller::inspect;
use serde_json::{json, Value};

use controller::cli::{Args, Certgen, Command, Output};

pub async fn run(command: Command, args: &Args) -> anyhow::Result<()> {
    match command {
        Command::Backends { name } => backends(args, name.as_deref()).await,
        Command::Certs => certs(args).await,
        Command::Conf { host } => conf(args, host.as_deref()),
        Command::Status => status(args).await,
        Command::Check => check(args).await,
        Command::Certgen(job) => certgen(args, job).await,
        // Printed by `main` before any runtime starts.
        Command::Reference { .. } => Ok(()),
    }
}

/// The migration report; an error (exit code 1) if anything is dropped.
async fn check(args: &Args) -> anyhow::Result<()> {
    let report = args.check_report().await?;
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Table => print!("{}", controller::check::text(&report)),
    }
    if report.drops_anything() {
        let s = &report.summary;
        anyhow::bail!(
            "switching would drop something: {} ignored, {} invalid, {} other problems",
            s.ignored,
            s.invalid,
            s.problems
        );
    }
    Ok(())
}

fn api_base(args: &Args) -> String {
    args.status_url
        .clone()
        .unwrap_or_else(|| format!("http://127.0.0.1:{}", args.api_port))
        .trim_end_matches('/')
        .to_string()
}

fn token(args: &Args) -> anyhow::Result<String> {
    let file = args
        .api_token_file
        .clone()
        .unwrap_or_else(|| args.conf_dir.join("api-token"));
    controller::token::read(&file)
        .context("the module API's token (run inside the controller's container, as its user)")
}

async fn get_json(url: &str, token: Option<&str>) -> anyhow::Result<(u16, Value)> {
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()?;
    let mut req = client.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.with_context(|| format!("GET {url}"))?;
    let code = resp.status().as_u16();
    let text = resp.text().await?;
    Ok((code, serde_json::from_str(&text).unwrap_or(Value::String(text))))
}

fn print(args: &Args, value: &Value, table: impl FnOnce() -> String) -> anyhow::Result<()> {
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(value)?),
        Output::Table => print!("{}", table()),
    }
    Ok(())
}

async fn backends(args: &Args, name: Option<&str>) -> anyhow::Result<()> {
    let token = token(args)?;
    let mut url = reqwest::Url::parse(&format!("{}/configuration/backends", api_base(args)))
        .context("--status-url is not a URL")?;
    if let Some(n) = name {
        // One path segment, percent-encoded: a name cannot reach another route.
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("--status-url cannot take a path"))?
            .push(n);
    }
    let (code, body) = get_json(url.as_str(), Some(&token)).await?;
    if code != 200 {
        anyhow::bail!("{url}: {code} {body}");
    }
    let list = match body {
        Value::Array(a) => a,
        Value::Null => Vec::new(),
        one => vec![one],
    };
    let typed: Vec<lua_compat::wire::Backend> =
        serde_json::from_value(Value::Array(list.clone())).context("decoding the module's backends")?;
    print(args, &Value::Array(list), || inspect::backends_table(&typed))
}

/// The certificates in the module's zone (its listing never holds a key).
async fn certs(args: &Args) -> anyhow::Result<()> {
    let token = token(args)?;
    let url = format!("{}/configuration/certificates", api_base(args));
    let (code, body) = get_json(&url, Some(&token)).await?;
    if code != 200 {
        anyhow::bail!("{url}: {code} {body}");
    }
    let typed: Vec<lua_compat::certificates::CertificateInfo> =
        serde_json::from_value(body.clone()).context("decoding the module's certificates")?;
    print(args, &body, || inspect::certs_table(&typed))
}

fn conf(args: &Args, host: Option<&str>) -> anyhow::Result<()> {
    let path = args.conf_dir.join("nginx.conf");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let out = match host {
        Some(h) => {
            let blocks = inspect::server_blocks(&text, &h.to_ascii_lowercase());
            if blocks.is_empty() {
                anyhow::bail!("no server block for host {h:?}");
            }
            blocks
        }
        None => text,
    };
    match args.output {
        Output::Json => println!("{}", json!({"host": host, "conf": out})),
        Output::Table => print!("{out}"),
    }
    Ok(())
}

async fn status(args: &Args) -> anyhow::Result<()> {
    let metrics_base = format!("http://{}", args.metrics_address);
    let ready = get_json(&format!("{metrics_base}/readyz"), None).await;
    let metrics = get_json(&format!("{metrics_base}/metrics"), None).await;
    let module = match token(args) {
        Ok(t) => get_json(&format!("{}/configuration/status", api_base(args)), Some(&t))
            .await
            .ok(),
        Err(_) => None,
    };
    let text = match &metrics {
        Ok((_, Value::String(t))) => t.clone(),
        _ => String::new(),
    };
    let m = |name: &str| inspect::metric(&text, &format!("nginx_ingress_controller_{name}"));
    let value = json!({
        "ready": matches!(ready, Ok((200, _))),
        "readyz": ready.as_ref().map(|(_, b)| b.clone()).unwrap_or_else(|e| Value::String(format!("{e:#}"))),
        "reloads": m("success"),
        "reload_errors": m("errors"),
        "last_reload_successful": m("config_last_reload_successful"),
        "quarantined_ingresses": m("quarantined_ingresses"),
        "refused_backends": m("refused_backends"),
        "invalid_values": m("invalid_values"),
        "nginx_restarts": m("nginx_restarts"),
        "module": module.as_ref().map(|(_, b)| b.clone()),
    });
    print(args, &value, || {
        let num = |v: &Value| v.as_f64().map_or("-".into(), |f| format!("{f}"));
        let workers = value["module"]["workers"].as_array().map_or(0, Vec::len);
        let rows = vec![
            vec!["ready".into(), value["ready"].to_string()],
            vec!["generation".into(), num(&value["module"]["generation"])],
            vec!["workers".into(), workers.to_string()],
            vec!["reloads".into(), num(&value["reloads"])],
            vec!["reload errors".into(), num(&value["reload_errors"])],
            vec!["quarantined ingresses".into(), num(&value["quarantined_ingresses"])],
            vec!["refused backends".into(), num(&value["refused_backends"])],
            vec!["invalid values".into(), num(&value["invalid_values"])],
            vec!["nginx restarts".into(), num(&value["nginx_restarts"])],
        ];
        inspect::table(&["FIELD", "VALUE"], &rows)
    })
}

async fn certgen(args: &Args, job: Certgen) -> anyhow::Result<()> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await.context("finding the cluster")?,
    };
    let client = kube::Client::try_from(config)?;
    match job {
        Certgen::Create {
            namespace,
            secret_name,
            host,
        } => {
            controller::certgen::create(client, &namespace, &secret_name, &host).await?;
        }
        Certgen::Patch {
            namespace,
            secret_name,
            webhook_name,
        } => controller::certgen::patch(client, &namespace, &secret_name, &webhook_name).await?,
    }
    Ok(())
}
