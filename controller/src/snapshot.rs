//! The input of the model builder: every object the controller watches, as
//! one consistent snapshot. Both sources (Kubernetes watchers and the
//! manifest directory) produce exactly this type.

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};

#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub ingresses: Vec<Ingress>,
    pub classes: Vec<IngressClass>,
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub secrets: Vec<Secret>,
    /// The controller's own ConfigMap (`--configmap`), if it exists.
    pub config_map: Option<ConfigMap>,
}

/// `namespace/name` of any object, for logs and conflict reports.
pub fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or("")
    )
}
