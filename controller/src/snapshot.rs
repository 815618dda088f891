//! The input of the model builder: every object the controller watches, as
//! one consistent snapshot. Both sources (Kubernetes watchers and the
//! manifest directory) produce exactly this type.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};

/// Objects are shared (`Arc`), not owned: in cluster mode they are the
/// reflector stores' own, so a snapshot costs a vector of pointers, not a
/// second copy of every object (at 10,000 Ingresses, Services and
/// EndpointSlices that copy was tens of megabytes, made again on every
/// change).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub ingresses: Vec<Arc<Ingress>>,
    pub classes: Vec<Arc<IngressClass>>,
    pub services: Vec<Arc<Service>>,
    pub slices: Vec<Arc<EndpointSlice>>,
    pub secrets: Vec<Arc<Secret>>,
    /// The controller's own ConfigMap (`--configmap`), if it exists.
    pub config_map: Option<Arc<ConfigMap>>,
    /// The other ConfigMaps of the controller's namespace: the header sets
    /// its `add-headers` and `proxy-set-headers` name.
    pub header_config_maps: Vec<Arc<ConfigMap>>,
    /// `--tcp-services-configmap`, if set and it exists.
    pub tcp_services: Option<Arc<ConfigMap>>,
    /// `--udp-services-configmap`, if set and it exists.
    pub udp_services: Option<Arc<ConfigMap>>,
}

/// The ConfigMaps a source picks out by `namespace/name`: the controller's
/// own (`--configmap`) and the layer-4 ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigMapRefs {
    pub config_map: (String, String),
    pub tcp_services: Option<(String, String)>,
    pub udp_services: Option<(String, String)>,
}

impl From<(String, String)> for ConfigMapRefs {
    fn from(config_map: (String, String)) -> Self {
        ConfigMapRefs {
            config_map,
            ..Default::default()
        }
    }
}

/// `namespace/name` of any object, for logs and conflict reports.
pub fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or("")
    )
}
