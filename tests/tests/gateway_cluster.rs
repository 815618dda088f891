//! Gateway API on a real kube-apiserver with the v1.7.0 CRDs and the
//! chart's RBAC, both installed by the chart (`gatewayAPI.enabled=true`,
//! `gatewayAPI.crds.install=true`): the controller watches
//! GatewayClasses, Gateways and HTTPRoutes, routes through the module's
//! route table, and writes the status the spec asks for (GatewayClass
//! Accepted and supportedFeatures, Gateway Accepted/Programmed with its
//! listeners and address, route parents Accepted/ResolvedRefs), and
//! takes a team's ListenerSet where the Gateway allows it.

use std::time::Duration;

use serde_json::Value;
use tests::controller::{request, service_at, wait_until, Cluster, Controller, STRICT};
use tests::free_port;
use tests::kube_apiserver::RealApiServer;
use tests::pod_network::POD_IP;
use tests::tls::TestCa;
use tests::upstream::Upstream;

const GROUP: &str = "/apis/gateway.networking.k8s.io/v1";

fn condition<'a>(conditions: &'a Value, type_: &str) -> Option<&'a Value> {
    conditions.as_array()?.iter().find(|c| c["type"] == type_)
}

fn is_true(conditions: &Value, type_: &str) -> bool {
    condition(conditions, type_).is_some_and(|c| c["status"] == "True")
}

fn route(backend: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{namespace: app, name: web}}\nspec:\n  parentRefs: [{{name: public, namespace: infra}}]\n  hostnames: [web.test]\n  rules:\n  - backendRefs: [{{name: {backend}, port: 80}}]\n"
    )
}

#[test]
fn gateway_api_on_a_real_apiserver() {
    let api = RealApiServer::start();
    // The CRDs come with the chart (gatewayAPI.crds.install).
    let id = api.install_chart(&["gatewayAPI.enabled=true", "gatewayAPI.crds.install=true"]);
    api.wait_gateway_crds();
    let (_, crd) =
        api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/listenersets.gateway.networking.k8s.io");
    let annotations = &crd["metadata"]["annotations"];
    assert_eq!(
        (
            &annotations["gateway.networking.k8s.io/bundle-version"],
            &annotations["helm.sh/resource-policy"]
        ),
        (&Value::from("v1.7.0"), &Value::from("keep")),
        "every standard CRD, kept when the chart goes"
    );
    let ups: Vec<Upstream> = (0..2).map(|_| Upstream::start_in_pod_network()).collect();
    let gw = free_port();
    api.apply_yaml(&service_at(POD_IP, "web", &[ups[0].port]).replace("namespace: demo", "namespace: app"));
    api.apply_yaml(&service_at(POD_IP, "web2", &[ups[1].port]).replace("namespace: demo", "namespace: app"));
    api.apply_yaml(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: dynamic}\nspec: {controllerName: dynamic-balancer.dev/gateway-controller}\n",
    );
    api.apply_yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{namespace: infra, name: public}}\nspec:\n  gatewayClassName: dynamic\n  listeners:\n  - {{name: http, protocol: HTTP, port: {gw}, allowedRoutes: {{namespaces: {{from: All}}}}}}\n"
    ));
    api.apply_yaml(&route("web"));
    let mut flags = id.args();
    flags.extend([STRICT, "--enable-gateway-api", "--publish-status-address=192.0.2.10"]);
    let c = Controller::start_on_cluster(&id.kubeconfig, &flags);

    let via = || request(gw, "web.test", "/").unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(20), || via().1 == ups[0].identity),
        "{}",
        c.log()
    );
    // The status, written with the chart's RBAC.
    assert!(
        wait_until(Duration::from_secs(20), || {
            let (_, class) = api.get(&format!("{GROUP}/gatewayclasses/dynamic"));
            let (_, gateway) = api.get(&format!("{GROUP}/namespaces/infra/gateways/public"));
            let (_, r) = api.get(&format!("{GROUP}/namespaces/app/httproutes/web"));
            let parent = &r["status"]["parents"][0];
            is_true(&class["status"]["conditions"], "Accepted")
                && class["status"]["supportedFeatures"]
                    .as_array()
                    .is_some_and(|f| f.len() > 3)
                && is_true(&gateway["status"]["conditions"], "Programmed")
                && gateway["status"]["addresses"][0]["value"] == "192.0.2.10"
                && gateway["status"]["listeners"][0]["attachedRoutes"] == 1
                && parent["controllerName"] == "dynamic-balancer.dev/gateway-controller"
                && is_true(&parent["conditions"], "Accepted")
                && is_true(&parent["conditions"], "ResolvedRefs")
        }),
        "status not written:\n{}",
        c.log()
    );
    let reloads = c.reloads();

    // The route moves to web2: traffic follows with no reload.
    api.apply_yaml(&route("web2"));
    assert!(
        wait_until(Duration::from_secs(20), || via().1 == ups[1].identity),
        "{}",
        c.log()
    );
    // A backend that does not exist: 500, and ResolvedRefs says why.
    api.apply_yaml(&route("missing"));
    assert!(wait_until(Duration::from_secs(20), || via().0 == 500), "{}", c.log());
    assert!(
        wait_until(Duration::from_secs(20), || {
            let (_, r) = api.get(&format!("{GROUP}/namespaces/app/httproutes/web"));
            condition(&r["status"]["parents"][0]["conditions"], "ResolvedRefs")
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "BackendNotFound")
        }),
        "{}",
        c.log()
    );
    assert_eq!(c.reloads(), reloads, "route edits never reload");

    // A team adds its own listener from its namespace with a ListenerSet,
    // which the Gateway takes from namespaces labelled for it; a route
    // naming the ListenerSet serves its host. Same port: no reload.
    api.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: team, labels: {listeners: allowed}}\n");
    api.apply_yaml(&service_at(POD_IP, "web", &[ups[1].port]).replace("namespace: demo", "namespace: team"));
    api.apply_yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{namespace: infra, name: public}}\nspec:\n  gatewayClassName: dynamic\n  allowedListeners: {{namespaces: {{from: Selector, selector: {{matchLabels: {{listeners: allowed}}}}}}}}\n  listeners:\n  - {{name: http, protocol: HTTP, port: {gw}, allowedRoutes: {{namespaces: {{from: All}}}}}}\n"
    ));
    let listener_set = |ns: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet\nmetadata: {{namespace: {ns}, name: extra}}\nspec:\n  parentRef: {{name: public, namespace: infra}}\n  listeners:\n  - {{name: team, protocol: HTTP, port: {gw}, hostname: team.test}}\n  - {{name: everything, protocol: HTTP, port: {gw}}}\n"
        )
    };
    api.apply_yaml(&listener_set("team"));
    api.apply_yaml(&listener_set("other"));
    api.apply_yaml(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {namespace: team, name: web}\nspec:\n  parentRefs: [{kind: ListenerSet, name: extra}]\n  rules:\n  - backendRefs: [{name: web, port: 80}]\n",
    );
    assert!(
        wait_until(Duration::from_secs(20), || request(gw, "team.test", "/")
            .unwrap_or_default()
            .1
            == ups[1].identity),
        "{}",
        c.log()
    );
    api.apply_yaml(&route("web2"));
    assert!(
        wait_until(Duration::from_secs(20), || via().1 == ups[1].identity),
        "the Gateway's own route still serves web.test:\n{}",
        c.log()
    );
    assert!(
        wait_until(Duration::from_secs(20), || {
            let (_, gateway) = api.get(&format!("{GROUP}/namespaces/infra/gateways/public"));
            let (_, team) = api.get(&format!("{GROUP}/namespaces/team/listenersets/extra"));
            let (_, other) = api.get(&format!("{GROUP}/namespaces/other/listenersets/extra"));
            let listener = |name: &str| {
                team["status"]["listeners"]
                    .as_array()
                    .and_then(|l| l.iter().find(|l| l["name"] == name).cloned())
                    .unwrap_or_default()
            };
            gateway["status"]["attachedListenerSets"] == 1
                && is_true(&team["status"]["conditions"], "Programmed")
                && listener("team")["attachedRoutes"] == 1
                && is_true(&listener("team")["conditions"], "Programmed")
                // No hostname on the Gateway's port again: the Gateway's
                // own listener keeps it.
                && condition(&listener("everything")["conditions"], "Conflicted")
                    .is_some_and(|c| c["status"] == "True" && c["reason"] == "HostnameConflict")
                && condition(&other["status"]["conditions"], "Accepted")
                    .is_some_and(|c| c["status"] == "False" && c["reason"] == "NotAllowed")
        }),
        "ListenerSet status not written:\n{:?}\n{}",
        api.get(&format!("{GROUP}/namespaces/team/listenersets/extra")),
        c.log()
    );
    assert_eq!(c.reloads(), reloads, "a ListenerSet on a bound port never reloads");

    // A BackendTLSPolicy whose CA is a ClusterTrustBundle (a beta API the
    // test apiserver serves): read through the chart's RBAC, it resolves.
    let ca = TestCa::new("Cluster Roots");
    let pem: String = ca.cert_pem.lines().map(|l| format!("    {l}\n")).collect();
    api.apply_yaml(&format!(
        "apiVersion: certificates.k8s.io/v1beta1\nkind: ClusterTrustBundle\nmetadata: {{name: cluster-roots}}\nspec:\n  trustBundle: |\n{pem}"
    ));
    api.apply_yaml(&route("web2"));
    api.apply_yaml(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {namespace: app, name: web2-tls}\nspec:\n  targetRefs: [{group: \"\", kind: Service, name: web2}]\n  validation:\n    caCertificateRefs: [{group: certificates.k8s.io, kind: ClusterTrustBundle, name: cluster-roots}]\n    hostname: web2.app.test\n",
    );
    assert!(
        wait_until(Duration::from_secs(20), || {
            let (_, p) = api.get(&format!("{GROUP}/namespaces/app/backendtlspolicies/web2-tls"));
            let conditions = &p["status"]["ancestors"][0]["conditions"];
            is_true(conditions, "Accepted") && is_true(conditions, "ResolvedRefs")
        }),
        "{:?}\n{}",
        api.get(&format!("{GROUP}/namespaces/app/backendtlspolicies/web2-tls")),
        c.log()
    );
    // Its Gateway deleted, a ListenerSet we accepted says so.
    let spare = free_port();
    api.apply_yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{namespace: infra, name: spare}}\nspec:\n  gatewayClassName: dynamic\n  allowedListeners: {{namespaces: {{from: All}}}}\n  listeners:\n  - {{name: http, protocol: HTTP, port: {spare}}}\n"
    ));
    api.apply_yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet\nmetadata: {{namespace: team, name: spare}}\nspec:\n  parentRef: {{name: spare, namespace: infra}}\n  listeners:\n  - {{name: team, protocol: HTTP, port: {spare}, hostname: spare.test}}\n"
    ));
    let spare_accepted = |status: &str, reason: &str| {
        let (_, ls) = api.get(&format!("{GROUP}/namespaces/team/listenersets/spare"));
        condition(&ls["status"]["conditions"], "Accepted")
            .is_some_and(|c| c["status"] == status && c["reason"] == reason)
    };
    // A route of that Gateway alone.
    api.apply_yaml(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {namespace: infra, name: spare}\nspec:\n  parentRefs: [{name: spare}]\n  rules:\n  - backendRefs: [{name: web, port: 80}]\n",
    );
    let spare_route_parents = || {
        let (_, r) = api.get(&format!("{GROUP}/namespaces/infra/httproutes/spare"));
        r["status"]["parents"].as_array().cloned().unwrap_or_default()
    };
    assert!(
        wait_until(Duration::from_secs(20), || spare_accepted("True", "Accepted")
            && spare_route_parents()
                .iter()
                .any(|p| p["controllerName"] == "dynamic-balancer.dev/gateway-controller")),
        "{}",
        c.log()
    );
    api.delete("Gateway", "infra", "spare");
    assert!(
        wait_until(Duration::from_secs(20), || spare_accepted("False", "ParentNotAccepted")),
        "{:?}\n{}",
        api.get(&format!("{GROUP}/namespaces/team/listenersets/spare")),
        c.log()
    );
    // The route's entry for the deleted Gateway goes with it.
    assert!(
        wait_until(Duration::from_secs(20), || spare_route_parents().is_empty()),
        "{:?}\n{}",
        spare_route_parents(),
        c.log()
    );
    assert!(
        !c.log().contains("forbidden"),
        "the chart's RBAC refused something:\n{}",
        c.log()
    );
}

/// A Gateway API kind whose CRD comes after the controller started
/// (installed later, or established a moment after a chart that installs
/// both) is watched once the apiserver serves it, with no restart; until
/// then everything else is served.
#[test]
fn a_crd_installed_after_the_controller_is_watched_without_a_restart() {
    let api = RealApiServer::start();
    api.install_gateway_crd_kinds(&["gatewayclasses", "gateways", "httproutes", "referencegrants"]);
    let id = api.install_chart(&["gatewayAPI.enabled=true"]);
    let up = Upstream::start_in_pod_network();
    let gw = free_port();
    api.apply_yaml(&service_at(POD_IP, "web", &[up.port]).replace("namespace: demo", "namespace: app"));
    api.apply_yaml(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: dynamic}\nspec: {controllerName: dynamic-balancer.dev/gateway-controller}\n",
    );
    api.apply_yaml(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{namespace: infra, name: public}}\nspec:\n  gatewayClassName: dynamic\n  listeners:\n  - {{name: http, protocol: HTTP, port: {gw}, allowedRoutes: {{namespaces: {{from: All}}}}}}\n"
    ));
    api.apply_yaml(&route("web"));
    let mut flags = id.args();
    flags.extend([STRICT, "--enable-gateway-api", "--publish-status-address=192.0.2.10"]);
    let c = Controller::start_on_cluster(&id.kubeconfig, &flags);
    assert!(
        wait_until(Duration::from_secs(20), || request(gw, "web.test", "/")
            .unwrap_or_default()
            .1
            == up.identity),
        "served without the missing kinds:\n{}",
        c.log()
    );
    assert!(c.log().contains("does not serve BackendTLSPolicy"), "{}", c.log());

    api.install_gateway_crd_kinds(&["backendtlspolicies"]);
    api.apply_yaml(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {namespace: app, name: web-tls}\nspec:\n  targetRefs: [{group: \"\", kind: Service, name: web}]\n  validation:\n    wellKnownCACertificates: System\n    hostname: web.app.test\n",
    );
    assert!(
        wait_until(Duration::from_secs(30), || {
            let (_, p) = api.get(&format!("{GROUP}/namespaces/app/backendtlspolicies/web-tls"));
            is_true(&p["status"]["ancestors"][0]["conditions"], "Accepted")
        }),
        "the policy was never seen:\n{}",
        c.log()
    );
    assert!(c.log().contains("serves BackendTLSPolicy now"), "{}", c.log());
    // The plain-text backend now gets a TLS handshake it does not answer
    // (502 when it closes, 504 when it waits for more).
    assert!(
        wait_until(Duration::from_secs(20), || matches!(
            request(gw, "web.test", "/").unwrap_or_default().0,
            502 | 504
        )),
        "{:?}\n{}",
        request(gw, "web.test", "/"),
        c.log()
    );
}
