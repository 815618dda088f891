//! Kubernetes Events, in cluster mode: a Warning on the object whose value
//! was refused, and `RELOAD` events on the controller's Pod (when
//! `POD_NAME`/`POD_NAMESPACE` are set), as ingress-nginx records them.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::model::Report;

#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    pod: Option<ObjectReference>,
}

impl Events {
    pub fn new(client: kube::Client) -> Self {
        let pod_name = std::env::var("POD_NAME").ok();
        let pod = pod_name
            .as_ref()
            .zip(std::env::var("POD_NAMESPACE").ok())
            .map(|(name, ns)| ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.clone()),
                namespace: Some(ns),
                ..Default::default()
            });
        let reporter = Reporter {
            controller: "ingress-controller".into(),
            instance: pod_name,
        };
        Events {
            recorder: Recorder::new(client, reporter),
            pod,
        }
    }

    /// A Warning on the object a [`Report`] names (`Kind namespace/name`).
    pub async fn refused(&self, report: &Report) {
        // A quarantined Ingress gets its own `Quarantined` event, with
        // nginx's message, from the structural path.
        if report.what == "quarantine" {
            return;
        }
        let Some((kind, key)) = report.object.split_once(' ') else {
            return;
        };
        let (namespace, name) = key.split_once('/').unwrap_or(("default", key));
        let api_version = match kind {
            "Ingress" => "networking.k8s.io/v1",
            "ConfigMap" | "Service" | "Secret" => "v1",
            _ => return,
        };
        let note = format!("{}: {}", report.what, report.reason);
        self.warn(api_version, kind, namespace, name, "InvalidValue", "Validate", note)
            .await;
    }

    /// A Warning `Quarantined` on an Ingress left out of nginx.conf because
    /// nginx refused what it renders, with nginx's message.
    pub async fn quarantined(&self, ingress: &str, message: &str) {
        let (namespace, name) = ingress.split_once('/').unwrap_or(("default", ingress));
        let note = format!(
            "nginx refused the configuration this Ingress produces; it is left out until it changes, and every other Ingress is applied. nginx said: {message}"
        );
        self.warn(
            "networking.k8s.io/v1",
            "Ingress",
            namespace,
            name,
            "Quarantined",
            "Reload",
            note,
        )
        .await;
    }

    /// Publishes a Warning Event about one object.
    #[allow(clippy::too_many_arguments)]
    async fn warn(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let reference = ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(truncate(note)),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::debug!(error = %e, "could not record an event");
        }
    }

    /// `RELOAD` on the controller's Pod: Normal on success, Warning with
    /// nginx's message on failure.
    pub async fn reload(&self, error: Option<&str>) {
        let Some(pod) = &self.pod else { return };
        let event = Event {
            type_: if error.is_some() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: "RELOAD".into(),
            note: Some(truncate(match error {
                Some(e) => format!("Error reloading NGINX: {e}"),
                None => "NGINX reload triggered due to a change in configuration".into(),
            })),
            action: "Reload".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, pod).await {
            tracing::debug!(error = %e, "could not record an event");
        }
    }
}

/// The API caps an event's note at 1 kB.
fn truncate(mut s: String) -> String {
    if s.len() > 1000 {
        let mut cut = 1000;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
