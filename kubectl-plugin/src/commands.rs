//! Each subcommand: what it asks the apiserver or the controller's Pod,
//! and how it prints the answer. The formatting of the controller's own
//! answers is the controller's (`controller::inspect`), so `kubectl exec
//! … ingress-controller backends` and this plugin print the same table.

use anyhow::{bail, Context as _};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{ListParams, LogParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::cli::{Cli, Command, Output, INGRESS_NGINX_SELECTOR};
use crate::target::{self, Found};
use crate::{in_pod, ingresses, remote};

/// Runs the command; its exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    let streaming = matches!(cli.command, Command::Logs { follow: true, .. } | Command::Exec { .. });
    let (client, context_ns) = target::client(&cli.target, streaming).await?;
    let ctx = Ctx {
        client,
        context_ns,
        cli: &cli,
    };
    match &cli.command {
        Command::Backends { backend, list } => ctx.backends(backend.as_deref(), *list).await,
        Command::Certs { host } => ctx.certs(host.as_deref()).await,
        Command::Conf { host } => ctx.conf(host.as_deref()).await,
        Command::General => ctx.general().await,
        Command::Info => ctx.info().await,
        Command::Ingresses { all_namespaces } => ctx.ingresses(*all_namespaces).await,
        Command::Check { flags } => ctx.check(flags).await,
        Command::Logs {
            follow,
            tail,
            since,
            timestamps,
            previous,
        } => {
            let params = LogParams {
                container: Some(cli.target.container.clone()),
                follow: *follow,
                tail_lines: *tail,
                since_seconds: since.map(|d| d.as_secs().max(1) as i64),
                timestamps: *timestamps,
                previous: *previous,
                ..Default::default()
            };
            ctx.logs(&params).await
        }
        Command::Exec { stdin, command } => ctx.exec(command, *stdin).await,
    }
}

struct Ctx<'a> {
    client: Client,
    context_ns: String,
    cli: &'a Cli,
}

impl Ctx<'_> {
    async fn found(&self) -> anyhow::Result<Found> {
        target::controller_pods(&self.client, &self.cli.target, &self.context_ns).await
    }

    fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// The controller's `subcommand` in `pod`, its JSON answer.
    async fn ask(&self, ns: &str, pod: &Pod, subcommand: &[&str]) -> anyhow::Result<Value> {
        let container = target::container(pod, &self.cli.target.container)?;
        let mut words = subcommand.to_vec();
        words.push("--output=json");
        let argv = in_pod::controller_command(pod, container, &words);
        let out = remote::capture(
            &self.pods(ns),
            target::name(pod),
            &container.name,
            &argv,
            self.cli.target.request_timeout,
        )
        .await?;
        remote::json_of(&out, &format!("`{}`", subcommand.join(" ")))
    }

    fn print(&self, value: &Value, table: impl FnOnce() -> anyhow::Result<String>) -> anyhow::Result<i32> {
        match self.cli.output {
            Output::Json => println!("{}", serde_json::to_string_pretty(value)?),
            Output::Table => print!("{}", table()?),
        }
        Ok(0)
    }

    async fn backends(&self, backend: Option<&str>, list: bool) -> anyhow::Result<i32> {
        let found = self.found().await?;
        let pod = target::first(&found);
        let name_flag = backend.map(|b| format!("--name={b}"));
        let mut words = vec!["backends"];
        words.extend(name_flag.as_deref());
        let value = self.ask(&found.namespace, pod, &words).await?;
        let items = match &value {
            Value::Array(a) => a.clone(),
            Value::Null => Vec::new(),
            one => vec![one.clone()],
        };
        if list {
            let names: Vec<Value> = items.iter().map(|b| b["name"].clone()).collect();
            return self.print(&Value::Array(names.clone()), || {
                Ok(names
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|n| format!("{n}\n"))
                    .collect())
            });
        }
        self.print(&Value::Array(items.clone()), || {
            let typed: Vec<lua_compat::wire::Backend> =
                serde_json::from_value(Value::Array(items)).context("decoding the module's backends")?;
            Ok(controller::inspect::backends_table(&typed))
        })
    }

    async fn certs(&self, host: Option<&str>) -> anyhow::Result<i32> {
        let found = self.found().await?;
        let pod = target::first(&found);
        let value = self.ask(&found.namespace, pod, &["certs"]).await?;
        let mut typed: Vec<lua_compat::certificates::CertificateInfo> =
            serde_json::from_value(value).context("decoding the module's certificates")?;
        if let Some(h) = host {
            typed.retain(|c| c.hosts.iter().chain(&c.sans).any(|n| ingresses::covers(n, h)));
            if typed.is_empty() {
                bail!("no certificate serves host {h:?}");
            }
        }
        let value = serde_json::to_value(&typed)?;
        self.print(&value, || Ok(controller::inspect::certs_table(&typed)))
    }

    async fn conf(&self, host: Option<&str>) -> anyhow::Result<i32> {
        let found = self.found().await?;
        let pod = target::first(&found);
        let flag = host.map(|h| format!("--host={h}"));
        let mut words = vec!["conf"];
        words.extend(flag.as_deref());
        let value = self.ask(&found.namespace, pod, &words).await?;
        self.print(&value, || Ok(value["conf"].as_str().unwrap_or_default().to_string()))
    }

    /// Every Pod's `status`, side by side (ingress-nginx's plugin printed
    /// only their count).
    async fn general(&self) -> anyhow::Result<i32> {
        let found = self.found().await?;
        let mut pods = Vec::new();
        for pod in &found.pods {
            let status = match self.ask(&found.namespace, pod, &["status"]).await {
                Ok(v) => v,
                Err(e) => json!({"error": format!("{e:#}")}),
            };
            pods.push(json!({"pod": target::name(pod), "podReady": target::is_ready(pod), "status": status}));
        }
        let value = json!({
            "namespace": found.namespace,
            "controllerPodsCount": found.pods.len(),
            "pods": pods,
        });
        self.print(&value, || {
            let num = |v: &Value| v.as_f64().map_or("-".to_string(), |f| format!("{f}"));
            let rows: Vec<Vec<String>> = pods
                .iter()
                .map(|p| {
                    let s = &p["status"];
                    vec![
                        p["pod"].as_str().unwrap_or_default().to_string(),
                        p["podReady"].to_string(),
                        s["ready"].as_bool().map_or("-".into(), |b| b.to_string()),
                        num(&s["module"]["generation"]),
                        s["module"]["workers"]
                            .as_array()
                            .map_or("-".into(), |w| w.len().to_string()),
                        num(&s["reloads"]),
                        num(&s["reload_errors"]),
                        num(&s["quarantined_ingresses"]),
                        s["error"].as_str().unwrap_or_default().to_string(),
                    ]
                })
                .collect();
            Ok(format!(
                "controller Pods in {}: {}\n{}",
                found.namespace,
                found.pods.len(),
                controller::inspect::table(
                    &[
                        "POD",
                        "POD READY",
                        "CONTROLLER READY",
                        "GENERATION",
                        "WORKERS",
                        "RELOADS",
                        "RELOAD ERRORS",
                        "QUARANTINED",
                        "ERROR"
                    ],
                    &rows
                )
            ))
        })
    }

    /// The Services whose selector takes the controller's Pods.
    async fn info(&self) -> anyhow::Result<i32> {
        let found = self.found().await?;
        let labels = found.pods[0].metadata.labels.clone().unwrap_or_default();
        let services = Api::<Service>::namespaced(self.client.clone(), &found.namespace)
            .list(&ListParams::default())
            .await?
            .items;
        let mut out = Vec::new();
        for s in services {
            let Some(spec) = &s.spec else { continue };
            let Some(sel) = spec.selector.as_ref().filter(|m| !m.is_empty()) else {
                continue;
            };
            if !sel.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                continue;
            }
            let lb: Vec<String> = s
                .status
                .as_ref()
                .and_then(|st| st.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
                .collect();
            let ports: Vec<String> = spec
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    let proto = p.protocol.as_deref().unwrap_or("TCP");
                    match p.node_port {
                        Some(np) => format!("{}:{np}/{proto}", p.port),
                        None => format!("{}/{proto}", p.port),
                    }
                })
                .collect();
            out.push(json!({
                "name": s.metadata.name,
                "type": spec.type_.as_deref().unwrap_or("ClusterIP"),
                "clusterIP": spec.cluster_ip,
                "loadBalancer": lb,
                "externalIPs": spec.external_ips.clone().unwrap_or_default(),
                "ports": ports,
            }));
        }
        let value = json!({"namespace": found.namespace, "services": out});
        self.print(&value, || {
            let list = |v: &Value| {
                v.as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(","))
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "<none>".into())
            };
            let rows: Vec<Vec<String>> = out
                .iter()
                .map(|s| {
                    vec![
                        s["name"].as_str().unwrap_or_default().to_string(),
                        s["type"].as_str().unwrap_or_default().to_string(),
                        s["clusterIP"].as_str().unwrap_or("<none>").to_string(),
                        list(&s["loadBalancer"]),
                        list(&s["externalIPs"]),
                        list(&s["ports"]),
                    ]
                })
                .collect();
            Ok(controller::inspect::table(
                &[
                    "SERVICE",
                    "TYPE",
                    "CLUSTER-IP",
                    "LOAD BALANCER IP|CNAME",
                    "EXTERNAL-IP",
                    "PORTS",
                ],
                &rows,
            ))
        })
    }

    async fn ingresses(&self, all: bool) -> anyhow::Result<i32> {
        let lp = ListParams::default();
        let ns = self
            .cli
            .target
            .namespace
            .clone()
            .unwrap_or_else(|| self.context_ns.clone());
        let (ings, slices) = if all {
            (
                Api::<Ingress>::all(self.client.clone()).list(&lp).await?.items,
                Api::<EndpointSlice>::all(self.client.clone()).list(&lp).await?.items,
            )
        } else {
            (
                Api::<Ingress>::namespaced(self.client.clone(), &ns)
                    .list(&lp)
                    .await?
                    .items,
                Api::<EndpointSlice>::namespaced(self.client.clone(), &ns)
                    .list(&lp)
                    .await?
                    .items,
            )
        };
        let rows = ingresses::rows(&ings, &slices);
        self.print(&ingresses::json(&rows), || Ok(ingresses::table(&rows, all)))
    }

    /// `check` with the flags of the controller that runs now (ours, else
    /// ingress-nginx's), then the user's.
    async fn check(&self, user_flags: &[String]) -> anyhow::Result<i32> {
        let t = &self.cli.target;
        let chosen = t.pod.is_some() || t.deployment.is_some() || t.selector != crate::cli::OUR_SELECTOR;
        let found = if chosen {
            Some(self.found().await?)
        } else {
            // Ours if installed, else ingress-nginx's, else no flags at all.
            let ns = t.namespace.as_deref();
            match target::find(&self.client, &t.selector, ns, &self.context_ns).await {
                Ok(f) => Some(f),
                Err(_) => target::find(&self.client, INGRESS_NGINX_SELECTOR, ns, &self.context_ns)
                    .await
                    .ok(),
            }
        };
        let mut argv = Vec::new();
        match &found {
            Some(f) => {
                let pod = &f.pods[0];
                let container = target::container(pod, &t.container).or_else(|_| {
                    pod.spec
                        .as_ref()
                        .and_then(|s| s.containers.first())
                        .context("no container")
                })?;
                eprintln!(
                    "check: the flags of Pod {}/{} (container {}), found as {}",
                    f.namespace,
                    target::name(pod),
                    container.name,
                    f.how
                );
                argv.extend(in_pod::args(pod, container));
            }
            None => eprintln!("check: no controller Pod found; ingress-nginx's default flags"),
        }
        argv.extend(user_flags.iter().cloned());
        let parsed = controller::cli::parse_foreign(&argv);
        for i in &parsed.ignored {
            eprintln!("check: left out {i}");
        }
        let report = parsed.args.check_cluster(self.client.clone()).await?;
        match self.cli.output {
            Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            Output::Table => print!("{}", controller::check::text(&report)),
        }
        if report.drops_anything() {
            let s = &report.summary;
            eprintln!(
                "switching would drop something: {} ignored, {} invalid, {} other problems",
                s.ignored, s.invalid, s.problems
            );
            return Ok(1);
        }
        Ok(0)
    }

    async fn logs(&self, params: &LogParams) -> anyhow::Result<i32> {
        use futures::{AsyncBufReadExt as _, TryStreamExt as _};
        use std::io::Write as _;
        let found = self.found().await?;
        let pod = target::first(&found);
        let stream = self
            .pods(&found.namespace)
            .log_stream(target::name(pod), params)
            .await
            .with_context(|| format!("the log of Pod {}/{}", found.namespace, target::name(pod)))?;
        let mut lines = std::pin::pin!(stream.lines());
        let mut out = std::io::stdout().lock();
        while let Some(line) = lines.try_next().await? {
            if writeln!(out, "{line}").is_err() {
                // The reader went away (`| head`): done.
                break;
            }
        }
        Ok(0)
    }

    async fn exec(&self, command: &[String], stdin: bool) -> anyhow::Result<i32> {
        let found = self.found().await?;
        let pod = target::first(&found);
        let container = target::container(pod, &self.cli.target.container)?;
        remote::interactive(
            &self.pods(&found.namespace),
            target::name(pod),
            &container.name,
            command,
            stdin,
        )
        .await
    }
}
