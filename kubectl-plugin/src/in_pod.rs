//! The controller's command line inside its Pod, read from the Pod's
//! spec: what the kubelet ran (with `$(VAR)` expanded as the kubelet
//! expands it), so an inspection subcommand run beside it (`exec`) reads
//! the same ports, directories and token file.

use k8s_openapi::api::core::v1::{Container, Pod};

/// The binary the image runs when the container names no `command`.
pub const IMAGE_ENTRYPOINT: &str = "ingress-controller";

/// The container's arguments as the kubelet passed them to the process:
/// `$(NAME)` replaced by the container's variable of that name (a literal
/// value or a field of the Pod), `$$` by `$`; a reference to a variable
/// it cannot know (from a ConfigMap or Secret) is left as written, as the
/// kubelet leaves an undefined one.
pub fn args(pod: &Pod, container: &Container) -> Vec<String> {
    let env = |name: &str| -> Option<String> {
        let var = container.env.as_ref()?.iter().rev().find(|v| v.name == name)?;
        if let Some(v) = &var.value {
            return Some(v.clone());
        }
        let path = var.value_from.as_ref()?.field_ref.as_ref()?.field_path.as_str();
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        match path {
            "metadata.name" => meta.name.clone(),
            "metadata.namespace" => meta.namespace.clone(),
            "metadata.uid" => meta.uid.clone(),
            "spec.nodeName" => spec?.node_name.clone(),
            "spec.serviceAccountName" => spec?.service_account_name.clone(),
            "status.podIP" => status?.pod_ip.clone(),
            "status.hostIP" => status?.host_ip.clone(),
            _ => None,
        }
    };
    container.args.iter().flatten().map(|a| expand(a, &env)).collect()
}

/// The command that runs `subcommand` of the controller's binary with the
/// container's own flags: the container's `command` (else the image's
/// entrypoint), its arguments, then the subcommand's words.
pub fn controller_command(pod: &Pod, container: &Container, subcommand: &[&str]) -> Vec<String> {
    let mut argv = match container.command.as_deref() {
        Some(c) if !c.is_empty() => c.to_vec(),
        _ => vec![IMAGE_ENTRYPOINT.to_string()],
    };
    argv.extend(args(pod, container));
    argv.extend(subcommand.iter().map(|s| s.to_string()));
    argv
}

/// Kubernetes' expansion of `$(VAR)` in a container's command and args.
fn expand(s: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match env(name) {
                        Some(v) => out.push_str(&v),
                        None => out.push_str(&rest[at..at + 2 + end + 1]),
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str(&rest[at..]);
                    rest = "";
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> (Pod, Container) {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ctl-7d9f", "namespace": "edge"},
            "spec": {"containers": [{
                "name": "controller",
                "args": [
                    "--configmap=$(POD_NAMESPACE)/ctl",
                    "--publish-service=$(POD_NAMESPACE)/$(SVC)",
                    "--election-id=$(UNKNOWN)",
                    "--price=$$5",
                    "--open=$(",
                ],
                "env": [
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "SVC", "value": "ctl-svc"},
                    {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
                ]
            }]}
        }))
        .unwrap();
        let c = pod.spec.as_ref().unwrap().containers[0].clone();
        (pod, c)
    }

    #[test]
    fn arguments_are_expanded_as_the_kubelet_expands_them() {
        let (pod, c) = pod();
        assert_eq!(
            args(&pod, &c),
            [
                "--configmap=edge/ctl",
                "--publish-service=edge/ctl-svc",
                "--election-id=$(UNKNOWN)",
                "--price=$5",
                "--open=$(",
            ]
        );
    }

    #[test]
    fn the_image_entrypoint_runs_the_subcommand_with_the_pods_flags() {
        let (pod, c) = pod();
        let argv = controller_command(&pod, &c, &["backends", "--output=json"]);
        assert_eq!(argv[0], "ingress-controller");
        assert_eq!(argv[1], "--configmap=edge/ctl");
        assert_eq!(&argv[argv.len() - 2..], ["backends", "--output=json"]);
        let mut c = c;
        c.command = Some(vec!["/bin/ctl".into(), "--quiet".into()]);
        assert_eq!(controller_command(&pod, &c, &["status"])[..2], ["/bin/ctl", "--quiet"]);
    }
}
