//! Finding the cluster and the controller's Pods in it, as kubectl and
//! ingress-nginx's plugin do: the kubeconfig's context, then Pods by
//! label (or a Deployment's selector, or one Pod by name).

use anyhow::{bail, Context as _};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::cli::Target;

/// A client for the target's kubeconfig and context, and the namespace
/// that context names (`default` if none). A `streaming` command (`logs
/// -f`, `exec`) may wait on the apiserver for as long as it runs.
pub async fn client(t: &Target, streaming: bool) -> anyhow::Result<(Client, String)> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let options = KubeConfigOptions {
        context: t.context.clone(),
        ..Default::default()
    };
    let mut config = match &t.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await?
        }
        None if t.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer()
            .await
            .context("finding a cluster: no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a Pod")?,
    };
    config.read_timeout = if streaming { None } else { Some(t.request_timeout) };
    config.connect_timeout = Some(t.request_timeout);
    let namespace = config.default_namespace.clone();
    Ok((Client::try_from(config)?, namespace))
}

/// The controller Pods found, in one namespace: Ready ones first, then by
/// name.
#[derive(Debug)]
pub struct Found {
    pub namespace: String,
    pub pods: Vec<Pod>,
    /// How they were found (for messages).
    pub how: String,
}

/// Finds the controller's Pods per `--pod`, `--deployment`, `--selector`
/// and `--namespace`.
pub async fn controller_pods(client: &Client, t: &Target, context_ns: &str) -> anyhow::Result<Found> {
    let ns = t.namespace.clone().unwrap_or_else(|| context_ns.to_string());
    if let Some(name) = &t.pod {
        let pod = Api::<Pod>::namespaced(client.clone(), &ns)
            .get(name)
            .await
            .with_context(|| format!("Pod {ns}/{name}"))?;
        return Ok(Found {
            namespace: ns.clone(),
            pods: vec![pod],
            how: format!("Pod {ns}/{name}"),
        });
    }
    let (selector, scoped) = match &t.deployment {
        Some(name) => {
            let d = Api::<Deployment>::namespaced(client.clone(), &ns)
                .get(name)
                .await
                .with_context(|| format!("Deployment {ns}/{name}"))?;
            let sel = d.spec.selector;
            (selector_string(&sel)?, true)
        }
        None => (t.selector.clone(), t.namespace.is_some()),
    };
    find(client, &selector, if scoped { Some(&ns) } else { None }, context_ns).await
}

/// Pods with `selector`: in `namespace`, else in every namespace (falling
/// back to the context's namespace when listing them all is forbidden).
pub async fn find(client: &Client, selector: &str, namespace: Option<&str>, context_ns: &str) -> anyhow::Result<Found> {
    let lp = ListParams::default().labels(selector);
    let (pods, scope) = match namespace {
        Some(ns) => (
            Api::<Pod>::namespaced(client.clone(), ns).list(&lp).await?.items,
            format!("namespace {ns}"),
        ),
        None => match Api::<Pod>::all(client.clone()).list(&lp).await {
            Ok(l) => (l.items, "any namespace".to_string()),
            Err(kube::Error::Api(s)) if s.code == 403 => (
                Api::<Pod>::namespaced(client.clone(), context_ns)
                    .list(&lp)
                    .await?
                    .items,
                format!("namespace {context_ns} (Pods of all namespaces: forbidden)"),
            ),
            Err(e) => return Err(e.into()),
        },
    };
    let how = format!("Pods labelled {selector} in {scope}");
    let pods = order(pods);
    let mut namespaces: Vec<&str> = pods.iter().filter_map(|p| p.metadata.namespace.as_deref()).collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    match namespaces.as_slice() {
        [] => bail!("no controller Pod found: no {how} (choose with -n, --deployment, --pod or -l)"),
        [one] => Ok(Found {
            namespace: one.to_string(),
            pods,
            how,
        }),
        many => bail!(
            "{how}: controllers in {} namespaces ({}); choose one with -n",
            many.len(),
            many.join(", ")
        ),
    }
}

/// Running Pods only, Ready ones first, then by name (a Pod being deleted
/// last): the first is the one single-Pod commands ask.
pub fn order(mut pods: Vec<Pod>) -> Vec<Pod> {
    pods.retain(|p| {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        !matches!(phase, Some("Succeeded" | "Failed"))
    });
    pods.sort_by_key(|p| {
        (
            p.metadata.deletion_timestamp.is_some(),
            !is_ready(p),
            p.metadata.namespace.clone(),
            p.metadata.name.clone(),
        )
    });
    pods
}

/// The Pod's `Ready` condition.
pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The first of the Pods found, telling which when there is a choice.
pub fn first(found: &Found) -> &Pod {
    let pod = &found.pods[0];
    if found.pods.len() > 1 {
        eprintln!(
            "{}: Pod {}/{} (1 of {}; --pod NAME for another)",
            found.how,
            found.namespace,
            name(pod),
            found.pods.len()
        );
    }
    pod
}

pub fn name(p: &Pod) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

/// The Pod's container of that name.
pub fn container<'a>(pod: &'a Pod, wanted: &str) -> anyhow::Result<&'a Container> {
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
    match containers.iter().find(|c| c.name == wanted) {
        Some(c) => Ok(c),
        None => bail!(
            "Pod {} has no container {wanted:?} (it has {}); choose with --container",
            name(pod),
            containers
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A label selector in the list form the API takes (`a=b,c in (d,e)`).
pub fn selector_string(sel: &LabelSelector) -> anyhow::Result<String> {
    let mut parts: Vec<String> = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in sel.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            other => bail!("selector operator {other:?} is not one Kubernetes knows"),
        });
    }
    if parts.is_empty() {
        bail!("an empty selector would take every Pod");
    }
    Ok(parts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, ready: bool, phase: &str, deleting: bool) -> Pod {
        let mut v = serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        });
        if deleting {
            v["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z".into();
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn ready_pods_come_first_then_by_name_and_finished_ones_not_at_all() {
        let pods = order(vec![
            pod("a", "c-3", true, "Running", true),
            pod("a", "c-2", false, "Running", false),
            pod("a", "c-1", false, "Failed", false),
            pod("a", "c-4", true, "Running", false),
            pod("a", "c-0", true, "Running", false),
        ]);
        let names: Vec<&str> = pods.iter().map(name).collect();
        assert_eq!(names, ["c-0", "c-4", "c-2", "c-3"]);
    }

    #[test]
    fn selectors_are_written_in_the_apis_list_form() {
        let sel: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app.kubernetes.io/name": "dynamic-balancer", "app.kubernetes.io/component": "controller"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["edge", "dmz"]},
                {"key": "canary", "operator": "DoesNotExist"}
            ]
        }))
        .unwrap();
        assert_eq!(
            selector_string(&sel).unwrap(),
            "app.kubernetes.io/component=controller,app.kubernetes.io/name=dynamic-balancer,tier in (edge,dmz),!canary"
        );
        assert!(selector_string(&LabelSelector::default()).is_err());
    }
}
