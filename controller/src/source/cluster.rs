//! The Kubernetes source: kube-runtime watchers feeding reflector stores,
//! one per kind, and a snapshot published after every change.
//!
//! The watchers own LIST/WATCH, bookmarks, 410 re-lists and backoff; this
//! module only decides what to watch and when the stores form a snapshot.

use std::sync::Arc;

use futures::{stream, Stream, StreamExt};
use k8s_openapi::api::certificates::v1beta1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::snapshot::{Snapshot, CA_BUNDLE_KEY};
use gateway_api_types::backendtlspolicies::BackendTlsPolicy;
use gateway_api_types::gatewayclasses::GatewayClass;
use gateway_api_types::gateways::Gateway;
use gateway_api_types::grpcroutes::GrpcRoute;
use gateway_api_types::httproutes::HttpRoute;
use gateway_api_types::listenersets::ListenerSet;
use gateway_api_types::referencegrants::ReferenceGrant;
use gateway_api_types::tcproutes::TcpRoute;
use gateway_api_types::tlsroutes::TlsRoute;
use gateway_api_types::udproutes::UdpRoute;

#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// `--watch-namespace`; `None` watches every namespace.
    pub namespace: Option<String>,
    /// `--configmap namespace/name`.
    pub config_map: (String, String),
    /// `--tcp-services-configmap` and `--udp-services-configmap`.
    pub tcp_services: Option<(String, String)>,
    pub udp_services: Option<(String, String)>,
    /// `--enable-gateway-api`: also watch GatewayClasses, Gateways,
    /// HTTPRoutes and ReferenceGrants (their CRDs must be installed).
    pub gateway_api: bool,
}

struct Stores {
    ingresses: Store<Ingress>,
    classes: Store<IngressClass>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    secrets: Store<Secret>,
    /// Opaque Secrets: basic-auth user lists (`auth-secret`).
    opaque_secrets: Store<Secret>,
    config_maps: Store<ConfigMap>,
    /// The name of the controller's own ConfigMap among `config_maps`.
    config_map_name: String,
    /// The layer-4 ConfigMaps, each watched alone (by name, in its own
    /// namespace).
    tcp_services: Option<Store<ConfigMap>>,
    udp_services: Option<Store<ConfigMap>>,
    /// With `--enable-gateway-api`.
    gateway: Option<GatewayStores>,
}

/// The Gateway API kinds' stores.
struct GatewayStores {
    classes: Store<GatewayClass>,
    gateways: Store<Gateway>,
    routes: Store<HttpRoute>,
    /// The route kinds a cluster may lack (CRDs of an older release, or
    /// the standard channel before v1.5): empty until served (`late`).
    grpc_routes: Store<GrpcRoute>,
    tcp_routes: Store<TcpRoute>,
    tls_routes: Store<TlsRoute>,
    udp_routes: Store<UdpRoute>,
    /// Empty until its CRD is served (`late`; standard since v1.5).
    listener_sets: Store<ListenerSet>,
    grants: Store<ReferenceGrant>,
    namespaces: Store<Namespace>,
    /// `None` when RBAC forbids listing ConfigMaps.
    ca_bundles: Option<Store<ConfigMap>>,
    /// Empty until its CRD is served (`late`).
    backend_tls_policies: Store<BackendTlsPolicy>,
    /// `None` when the cluster does not serve ClusterTrustBundles (or
    /// RBAC forbids reading them).
    cluster_trust_bundles: Option<Store<ClusterTrustBundle>>,
    /// The kinds the apiserver did not serve at start: their stores fill
    /// once it does, and are not waited for.
    late: Vec<String>,
}

/// The one object a by-name store holds.
fn first(store: &Store<ConfigMap>) -> Option<Arc<ConfigMap>> {
    store.state().into_iter().next()
}

impl Stores {
    fn snapshot(&self) -> Snapshot {
        fn all<K: Clone + Resource + 'static>(s: &Store<K>) -> Vec<Arc<K>>
        where
            K::DynamicType: std::hash::Hash + Eq + Clone,
        {
            s.state()
        }
        Snapshot {
            ingresses: all(&self.ingresses),
            classes: all(&self.classes),
            services: all(&self.services),
            slices: all(&self.slices),
            secrets: all(&self.secrets)
                .into_iter()
                .chain(all(&self.opaque_secrets))
                .collect(),
            config_map: self
                .config_maps
                .state()
                .into_iter()
                .find(|c| c.metadata.name.as_deref() == Some(&*self.config_map_name)),
            header_config_maps: self
                .config_maps
                .state()
                .into_iter()
                .filter(|c| c.metadata.name.as_deref() != Some(&*self.config_map_name))
                .collect(),
            tcp_services: self.tcp_services.as_ref().and_then(first),
            udp_services: self.udp_services.as_ref().and_then(first),
            gateway_classes: self.gateway.as_ref().map(|g| all(&g.classes)).unwrap_or_default(),
            gateways: self.gateway.as_ref().map(|g| all(&g.gateways)).unwrap_or_default(),
            http_routes: self.gateway.as_ref().map(|g| all(&g.routes)).unwrap_or_default(),
            grpc_routes: self.gateway.as_ref().map(|g| all(&g.grpc_routes)).unwrap_or_default(),
            tcp_routes: self.gateway.as_ref().map(|g| all(&g.tcp_routes)).unwrap_or_default(),
            tls_routes: self.gateway.as_ref().map(|g| all(&g.tls_routes)).unwrap_or_default(),
            udp_routes: self.gateway.as_ref().map(|g| all(&g.udp_routes)).unwrap_or_default(),
            listener_sets: self.gateway.as_ref().map(|g| all(&g.listener_sets)).unwrap_or_default(),
            reference_grants: self.gateway.as_ref().map(|g| all(&g.grants)).unwrap_or_default(),
            namespaces: self.gateway.as_ref().map(|g| all(&g.namespaces)).unwrap_or_default(),
            ca_bundles: self
                .gateway
                .as_ref()
                .and_then(|g| g.ca_bundles.as_ref())
                .map(|store| {
                    all(store)
                        .into_iter()
                        .filter(|c| c.data.as_ref().is_some_and(|d| d.contains_key(CA_BUNDLE_KEY)))
                        .collect()
                })
                .unwrap_or_default(),
            backend_tls_policies: self
                .gateway
                .as_ref()
                .map(|g| all(&g.backend_tls_policies))
                .unwrap_or_default(),
            cluster_trust_bundles: self
                .gateway
                .as_ref()
                .and_then(|g| g.cluster_trust_bundles.as_ref())
                .map(all)
                .unwrap_or_default(),
        }
    }

    async fn ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.ingresses.wait_until_ready().await?;
        self.classes.wait_until_ready().await?;
        self.services.wait_until_ready().await?;
        self.slices.wait_until_ready().await?;
        self.secrets.wait_until_ready().await?;
        self.opaque_secrets.wait_until_ready().await?;
        for store in [&self.tcp_services, &self.udp_services].into_iter().flatten() {
            store.wait_until_ready().await?;
        }
        if let Some(g) = &self.gateway {
            g.classes.wait_until_ready().await?;
            g.gateways.wait_until_ready().await?;
            g.routes.wait_until_ready().await?;
            ready_unless_late(&g.grpc_routes, &g.late).await?;
            ready_unless_late(&g.tcp_routes, &g.late).await?;
            ready_unless_late(&g.tls_routes, &g.late).await?;
            ready_unless_late(&g.udp_routes, &g.late).await?;
            ready_unless_late(&g.listener_sets, &g.late).await?;
            g.grants.wait_until_ready().await?;
            g.namespaces.wait_until_ready().await?;
            if let Some(s) = &g.ca_bundles {
                s.wait_until_ready().await?;
            }
            ready_unless_late(&g.backend_tls_policies, &g.late).await?;
            if let Some(s) = &g.cluster_trust_bundles {
                s.wait_until_ready().await?;
            }
        }
        self.config_maps.wait_until_ready().await
    }
}

/// Waits for an optional kind's store, unless the kind was not served at
/// start (see [`optional_kind`]).
async fn ready_unless_late<K>(store: &Store<K>, late: &[String]) -> Result<(), reflector::store::WriterDropped>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone,
{
    if late.contains(&K::kind(&Default::default()).to_string()) {
        return Ok(());
    }
    store.wait_until_ready().await
}

/// A reflector for one kind, as a stream of "something changed" ticks. Ticks
/// come only when the store changed: on a (re)list's end, not per item.
fn reflect<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, impl Stream<Item = ()> + Send)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone,
{
    reflect_trimmed(api, config, |_| {})
}

/// [`reflect`], with `trim` dropping what else of each object the model
/// never reads before the store keeps it.
fn reflect_trimmed<K>(
    api: Api<K>,
    config: watcher::Config,
    mut trim: impl FnMut(&mut K) + Send + 'static,
) -> (Store<K>, impl Stream<Item = ()> + Send)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone,
{
    let (store, writer) = reflector::store();
    let kind = K::kind(&Default::default()).to_string();
    // What the model never reads is dropped before the store keeps it:
    // managedFields (server-side apply bookkeeping, often larger than the
    // object) and kubectl's last-applied copy of the whole object. At 10,000
    // Ingresses, Services and EndpointSlices that is most of the stores.
    let slim = watcher(api, config).default_backoff().modify(move |obj: &mut K| {
        obj.managed_fields_mut().clear();
        obj.annotations_mut().remove(LAST_APPLIED);
        trim(obj);
    });
    let ticks = reflector::reflector(writer, slim).filter_map(move |ev| {
        let kind = kind.clone();
        async move {
            match ev {
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => None,
                Ok(_) => Some(()),
                Err(e) => {
                    tracing::warn!(%kind, error = %e, "watch failed; retrying with backoff");
                    None
                }
            }
        }
    });
    (store, ticks)
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// [`run`] as a task of the current runtime.
///
/// Spawned here rather than by the binary: `tokio::spawn` compiles the
/// task's whole body where it is called, and from `main.rs` every watcher
/// and status writer was compiled a second time (the binary took longer
/// to build than the library).
pub fn spawn(client: Client, opts: ClusterOptions, tx: watch::Sender<Arc<Snapshot>>) -> JoinHandle<anyhow::Result<()>> {
    tokio::spawn(run(client, opts, tx))
}

/// Watches until the process ends, publishing a snapshot once every store
/// has listed, then after every change (bursts coalesce in the channel).
pub async fn run(client: Client, opts: ClusterOptions, tx: watch::Sender<Arc<Snapshot>>) -> anyhow::Result<()> {
    for (flag, target) in [
        ("--tcp-services-configmap", &opts.tcp_services),
        ("--udp-services-configmap", &opts.udp_services),
    ] {
        if let Some((ns, name)) = target {
            readable(&client, ns, name, flag).await?;
        }
    }
    let ns = opts.namespace.as_deref();
    let (ingresses, t1) = reflect(api::<Ingress>(&client, ns), watcher::Config::default());
    let (classes, t2) = reflect(Api::<IngressClass>::all(client.clone()), watcher::Config::default());
    let (services, t3) = reflect(api::<Service>(&client, ns), watcher::Config::default());
    let slice_cfg = watcher::Config::default().labels("kubernetes.io/service-name");
    let (slices, t4) = reflect(api::<EndpointSlice>(&client, ns), slice_cfg);
    let secret_cfg = watcher::Config::default().fields("type=kubernetes.io/tls");
    let (secrets, t5) = reflect(api::<Secret>(&client, ns), secret_cfg);
    // Only TLS and Opaque Secrets: never service-account tokens or Helm's
    // release records, which are many and large.
    let opaque_cfg = watcher::Config::default().fields("type=Opaque");
    let (opaque_secrets, t7) = reflect(api::<Secret>(&client, ns), opaque_cfg);
    let (cm_ns, cm_name) = &opts.config_map;
    // Every ConfigMap of the controller's namespace: its own, and the header
    // sets add-headers and proxy-set-headers name (only that namespace's).
    let (config_maps, t6) = reflect(
        Api::<ConfigMap>::namespaced(client.clone(), cm_ns),
        watcher::Config::default(),
    );
    let mut l4_ticks = Vec::new();
    let mut by_name = |target: &Option<(String, String)>| {
        target.as_ref().map(|(ns, name)| {
            let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
            let (store, ticks) = reflect(Api::<ConfigMap>::namespaced(client.clone(), ns), cfg);
            l4_ticks.push(ticks.boxed());
            store
        })
    };
    let tcp_services = by_name(&opts.tcp_services);
    let udp_services = by_name(&opts.udp_services);
    let gateway = if opts.gateway_api {
        gateway_crds_installed(&client).await?;
        let mut late = Vec::new();
        let (classes, g1) = reflect(Api::<GatewayClass>::all(client.clone()), watcher::Config::default());
        let (gateways, g2) = reflect(api::<Gateway>(&client, ns), watcher::Config::default());
        let (routes, g3) = reflect(api::<HttpRoute>(&client, ns), watcher::Config::default());
        let grpc_routes = optional_kind::<GrpcRoute>(&client, ns, &mut l4_ticks, &mut late).await;
        let tcp_routes = optional_kind::<TcpRoute>(&client, ns, &mut l4_ticks, &mut late).await;
        let tls_routes = optional_kind::<TlsRoute>(&client, ns, &mut l4_ticks, &mut late).await;
        let udp_routes = optional_kind::<UdpRoute>(&client, ns, &mut l4_ticks, &mut late).await;
        let listener_sets = optional_kind::<ListenerSet>(&client, ns, &mut l4_ticks, &mut late).await;
        let (grants, g4) = reflect(api::<ReferenceGrant>(&client, ns), watcher::Config::default());
        // Their labels, for listeners that admit routes by namespace selector.
        let (namespaces, g5) = reflect(Api::<Namespace>::all(client.clone()), watcher::Config::default());
        // Client CA bundles (`spec.tls.frontend`): ConfigMaps keep their
        // `ca.crt` only, so a namespace's large ConfigMaps cost nothing.
        let ca_bundles = ca_bundles(&client, ns, &mut l4_ticks).await;
        let backend_tls_policies = optional_kind::<BackendTlsPolicy>(&client, ns, &mut l4_ticks, &mut late).await;
        let cluster_trust_bundles = cluster_trust_bundles(&client, &mut l4_ticks).await;
        l4_ticks.extend([g1.boxed(), g2.boxed(), g3.boxed(), g4.boxed(), g5.boxed()]);
        Some(GatewayStores {
            classes,
            gateways,
            routes,
            grpc_routes,
            tcp_routes,
            tls_routes,
            udp_routes,
            listener_sets,
            grants,
            namespaces,
            ca_bundles,
            backend_tls_policies,
            cluster_trust_bundles,
            late,
        })
    } else {
        None
    };
    let stores = Stores {
        ingresses,
        classes,
        services,
        slices,
        secrets,
        opaque_secrets,
        config_maps,
        config_map_name: cm_name.clone(),
        tcp_services,
        udp_services,
        gateway,
    };

    let changed = Arc::new(Notify::new());
    let ticks = stream::select_all(
        [
            t1.boxed(),
            t2.boxed(),
            t3.boxed(),
            t4.boxed(),
            t5.boxed(),
            t6.boxed(),
            t7.boxed(),
        ]
        .into_iter()
        .chain(l4_ticks),
    );
    let notify = changed.clone();
    let driver = tokio::spawn(ticks.for_each(move |()| {
        notify.notify_one();
        async {}
    }));

    stores.ready().await?;
    tracing::info!("all watches listed; publishing snapshots");
    loop {
        let snap = stores.snapshot();
        if tx.send(Arc::new(snap)).is_err() {
            break;
        }
        tokio::select! {
            _ = changed.notified() => {}
            _ = tx.closed() => break,
        }
    }
    driver.abort();
    Ok(())
}

/// Fails, with what to do, when `--enable-gateway-api` is given but the
/// Gateway API CRDs are not installed (their watchers would retry forever
/// and no snapshot would ever come).
async fn gateway_crds_installed(client: &Client) -> anyhow::Result<()> {
    let params = kube::api::ListParams::default().limit(1);
    match Api::<GatewayClass>::all(client.clone()).list(&params).await {
        Err(kube::Error::Api(e)) if e.code == 404 => anyhow::bail!(
            "--enable-gateway-api: the Gateway API CRDs (gateway.networking.k8s.io/v1) are not installed; install the v1.7.0 standard CRDs first (kubectl apply --server-side -f the config/crd/standard directory of sigs.k8s.io/gateway-api@v1.7.0) or drop the flag"
        ),
        _ => Ok(()),
    }
}

/// A watch of a Gateway API kind that a cluster may lack. When the
/// apiserver does not serve it (its CRD is not installed, or not yet
/// established: a chart installing the CRDs with the controller races it),
/// the kind is said to be missing and looked for again every 10 s; its
/// watch starts once it is served, with no restart. Meanwhile its store is
/// empty and is not waited for (`late`), so the other kinds (and every
/// Ingress) are served rather than waiting for a watch that cannot start.
async fn optional_kind<K>(
    client: &Client,
    ns: Option<&str>,
    ticks: &mut Vec<futures::stream::BoxStream<'static, ()>>,
    late: &mut Vec<String>,
) -> Store<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone,
{
    let kind = K::kind(&Default::default()).to_string();
    let params = kube::api::ListParams::default().limit(1);
    let missing = matches!(api::<K>(client, ns).list(&params).await, Err(kube::Error::Api(e)) if e.code == 404);
    let (store, t) = reflect(api::<K>(client, ns), watcher::Config::default());
    if !missing {
        ticks.push(t.boxed());
        return store;
    }
    tracing::warn!(
        %kind,
        "the apiserver does not serve {kind} (its CRD is not installed): {kind} objects are watched once it is (looked for every 10 s); install the Gateway API v1.7.0 standard CRDs"
    );
    late.push(kind.clone());
    let probe = api::<K>(client, ns);
    let delayed = stream::once(async move {
        loop {
            tokio::time::sleep(LATE_KIND_PERIOD).await;
            match probe.list(&params).await {
                Err(kube::Error::Api(e)) if e.code == 404 => continue,
                _ => break,
            }
        }
        tracing::info!(%kind, "the apiserver serves {kind} now: watching it");
        t
    })
    .flatten();
    ticks.push(delayed.boxed());
    store
}

/// How often a Gateway API kind the apiserver did not serve is looked for.
const LATE_KIND_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// The watch of ClusterTrustBundles (`certificates.k8s.io/v1beta1`, a
/// beta API the cluster may not serve): `None`, said once, when it does
/// not or RBAC forbids it (a controller given no cluster-wide reads; the
/// chart's ClusterRole grants them); a reference to one then does not
/// resolve.
async fn cluster_trust_bundles(
    client: &Client,
    ticks: &mut Vec<futures::stream::BoxStream<'static, ()>>,
) -> Option<Store<ClusterTrustBundle>> {
    let all = Api::<ClusterTrustBundle>::all(client.clone());
    if let Err(kube::Error::Api(e)) = all.list(&kube::api::ListParams::default().limit(1)).await {
        if e.code == 404 || e.code == 403 {
            tracing::info!(
                code = e.code,
                "ClusterTrustBundles (certificates.k8s.io/v1beta1) are not watched: {}; references to them do not resolve (enable the API, or grant list and watch on clustertrustbundles, and restart)",
                if e.code == 404 { "the cluster does not serve them" } else { "RBAC forbids reading them" }
            );
            return None;
        }
    }
    let (store, t) = reflect(all, watcher::Config::default());
    ticks.push(t.boxed());
    Some(store)
}

/// The watch of client CA bundles (`spec.tls.frontend`): every ConfigMap
/// of the watched namespaces, each trimmed to its `ca.crt`, so a
/// namespace's large ConfigMaps cost nothing kept. `None`, with a warning,
/// when RBAC forbids listing them (a controller upgraded without its
/// chart's RBAC): everything else is served, and a Gateway that asks for
/// client certificate validation gets its listeners refused (no CA
/// resolves), never served without it.
async fn ca_bundles(
    client: &Client,
    ns: Option<&str>,
    ticks: &mut Vec<futures::stream::BoxStream<'static, ()>>,
) -> Option<Store<ConfigMap>> {
    let params = kube::api::ListParams::default().limit(1);
    if let Err(kube::Error::Api(e)) = api::<ConfigMap>(client, ns).list(&params).await {
        if e.code == 403 {
            tracing::warn!(
                "the controller may not list ConfigMaps ({}): Gateways' client CA bundles (spec.tls.frontend) cannot be read, and listeners that ask for them are not served; grant list and watch on configmaps (the chart does with gatewayAPI.enabled) and restart",
                e.message
            );
            return None;
        }
    }
    let (store, t) = reflect_trimmed(api::<ConfigMap>(client, ns), watcher::Config::default(), |cm| {
        cm.binary_data = None;
        if let Some(data) = &mut cm.data {
            data.retain(|k, _| k == CA_BUNDLE_KEY);
        }
    });
    ticks.push(t.boxed());
    Some(store)
}

/// Fails when RBAC forbids reading a layer-4 ConfigMap: its watcher would
/// retry forever, the stores would never be ready and no snapshot would
/// come, with HTTP down too. A ConfigMap in another namespace than the
/// controller's own needs its own Role. Other errors (an apiserver not
/// answering yet) are left to the watcher's backoff.
async fn readable(client: &Client, ns: &str, name: &str, flag: &str) -> anyhow::Result<()> {
    let params = kube::api::ListParams::default()
        .fields(&format!("metadata.name={name}"))
        .limit(1);
    match Api::<ConfigMap>::namespaced(client.clone(), ns).list(&params).await {
        Err(kube::Error::Api(e)) if e.code == 403 => anyhow::bail!(
            "{flag} {ns}/{name}: the controller may not list ConfigMaps in namespace {ns} ({}); grant list and watch on configmaps there",
            e.message
        ),
        _ => Ok(()),
    }
}

/// One LIST of every kind the model reads (for `ingress-controller check`):
/// the same selectors as the watchers, no watch. A kind the caller may not
/// list (Secrets, often) is left empty with a warning rather than failing
/// the whole report.
pub async fn list_once(client: Client, opts: &ClusterOptions) -> anyhow::Result<Snapshot> {
    use kube::api::ListParams;

    async fn list<K>(api: Api<K>, params: ListParams, required: bool) -> anyhow::Result<Vec<Arc<K>>>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let kind = K::kind(&Default::default()).to_string();
        match api.list(&params).await {
            Ok(list) => Ok(list.items.into_iter().map(Arc::new).collect()),
            Err(e) if !required => {
                tracing::warn!(%kind, error = %e, "cannot list; checking without them");
                Ok(Vec::new())
            }
            Err(e) => Err(anyhow::Error::new(e).context(format!("listing {kind}"))),
        }
    }
    let ns = opts.namespace.as_deref();
    let (cm_ns, cm_name) = &opts.config_map;
    let all = ListParams::default;
    let config_maps = list(Api::<ConfigMap>::namespaced(client.clone(), cm_ns), all(), false).await?;
    let by_name = |target: &Option<(String, String)>| {
        let target = target.clone();
        let client = client.clone();
        async move {
            let Some((ns, name)) = target else {
                return Ok::<_, anyhow::Error>(None);
            };
            let params = ListParams::default().fields(&format!("metadata.name={name}"));
            Ok(list(Api::<ConfigMap>::namespaced(client, &ns), params, false)
                .await?
                .into_iter()
                .next())
        }
    };
    let tcp_services = by_name(&opts.tcp_services).await?;
    let udp_services = by_name(&opts.udp_services).await?;
    Ok(Snapshot {
        ingresses: list(api::<Ingress>(&client, ns), all(), true).await?,
        classes: list(Api::<IngressClass>::all(client.clone()), all(), false).await?,
        services: list(api::<Service>(&client, ns), all(), false).await?,
        slices: list(
            api::<EndpointSlice>(&client, ns),
            all().labels("kubernetes.io/service-name"),
            false,
        )
        .await?,
        secrets: list(
            api::<Secret>(&client, ns),
            all().fields("type=kubernetes.io/tls"),
            false,
        )
        .await?,
        config_map: config_maps
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(cm_name.as_str()))
            .cloned(),
        header_config_maps: config_maps
            .iter()
            .filter(|c| c.metadata.name.as_deref() != Some(cm_name.as_str()))
            .cloned()
            .collect(),
        tcp_services,
        udp_services,
        ..Default::default()
    })
}
