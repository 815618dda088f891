//! The controller against the fake apiserver (`tests::apiserver`): kube's
//! real client and watchers over loopback HTTP, with real nginx behind.
//! The first tests check the fake itself speaks the protocol.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::time::Duration;

use serde_json::{json, Value};
use tests::apiserver::FakeApiServer;
use tests::controller::{
    agent, alternate_endpoints, get_url, ingress, service, set_endpoints, wait_until, Cluster, Controller,
    INGRESS_CLASS,
};
use tests::upstream::Upstream;

/// Reads watch events from `url` until `n` lines or the stream ends.
fn watch_lines(url: &str, n: usize) -> Vec<Value> {
    let resp = agent().get(url).call().unwrap();
    let reader = BufReader::new(resp.into_body().into_reader());
    reader
        .lines()
        .take(n)
        .map_while(Result::ok)
        .map(|l| serde_json::from_str(&l).unwrap())
        .collect()
}

#[test]
fn fake_lists_with_rv_watches_with_replay_and_selectors() {
    let api = FakeApiServer::start();
    api.apply_yaml(&service("a", &[1001]));
    api.apply_yaml(&service("b", &[1002]));
    let (_, body) = get_url(&format!(
        "{}/apis/discovery.k8s.io/v1/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Da",
        api.url()
    ))
    .unwrap();
    let list: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["kind"], "EndpointSliceList");
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "labelSelector");
    let rv: u64 = list["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    assert_eq!(rv, api.resource_version());

    // History replay from rv 1: everything after the first object.
    let events = watch_lines(
        &format!(
            "{}/api/v1/services?watch=true&resourceVersion=1&timeoutSeconds=1",
            api.url()
        ),
        1,
    );
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "b");

    // Idle with bookmarks allowed: a BOOKMARK carrying the current rv.
    let events = watch_lines(
        &format!(
            "{}/api/v1/services?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=2",
            api.url()
        ),
        1,
    );
    assert_eq!(events[0]["type"], "BOOKMARK");
    assert_eq!(events[0]["object"]["metadata"]["resourceVersion"], rv.to_string());
}

#[test]
fn fake_answers_410_after_compaction_in_the_real_shape() {
    let api = FakeApiServer::start();
    api.apply_yaml(&service("a", &[1001]));
    api.compact();
    let events = watch_lines(
        &format!("{}/api/v1/services?watch=true&resourceVersion=1", api.url()),
        5,
    );
    assert_eq!(events.len(), 1);
    let expected = json!({"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
        "message": format!("too old resource version: 1 ({})", api.resource_version()),"reason":"Expired","code":410}});
    assert_eq!(events[0], expected);
}

#[test]
fn fake_create_update_patch_with_conflicts() {
    let api = FakeApiServer::start();
    let base = format!("{}/api/v1/namespaces/demo/configmaps", api.url());
    let cm = json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"k":"1"}});
    let send = |method: &str, url: &str, body: &Value| {
        let req = ureq::http::Request::builder()
            .method(method)
            .uri(url)
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .unwrap();
        let mut resp = agent().run(req).unwrap();
        let status = resp.status().as_u16();
        (
            status,
            serde_json::from_str::<Value>(&resp.body_mut().read_to_string().unwrap()).unwrap(),
        )
    };
    let (code, created) = send("POST", &base, &cm);
    assert_eq!(code, 201);
    assert_eq!(send("POST", &base, &cm).0, 409, "AlreadyExists");
    let rv = created["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    let mut update = created.clone();
    update["data"]["k"] = json!("2");
    let (code, updated) = send("PUT", &format!("{base}/c"), &update);
    assert_eq!(code, 200);
    assert_eq!(updated["data"]["k"], "2");
    // The same stale rv again: Conflict, and nothing changes.
    let (code, status) = send("PUT", &format!("{base}/c"), &update);
    assert_eq!((code, status["reason"].as_str()), (409, Some("Conflict")));
    let (code, patched) = send("PATCH", &format!("{base}/c"), &json!({"data": {"extra": "x"}}));
    assert_eq!(code, 200);
    assert_eq!(patched["data"], json!({"k": "2", "extra": "x"}));
    let stale = json!({"metadata": {"resourceVersion": rv}, "data": {"k": "3"}});
    assert_eq!(send("PATCH", &format!("{base}/c"), &stale).0, 409);
}

/// Objects for a host served by Service `web` with endpoints `ports`.
fn setup(api: &FakeApiServer, ports: &[u16]) {
    api.apply_yaml(INGRESS_CLASS);
    api.apply_yaml(&service("web", ports));
    api.apply_yaml(&ingress("web", "web.test", "/", "web", &[]));
}

#[test]
fn controller_on_the_fake_apiserver_routes_scales_without_reload_and_reloads_once_per_host() {
    let api = FakeApiServer::start();
    let ups: Vec<Upstream> = (0..3).map(|_| Upstream::start()).collect();
    setup(&api, &[ups[0].port]);
    let c = Controller::start_on_cluster(&api.kubeconfig(), &[]);
    assert_eq!(c.get("web.test", "/").1, ups[0].identity);
    let workers = c.worker_pids();

    alternate_endpoints(&api, &c, &ups, 50, Duration::from_secs(10));
    assert_eq!(c.reloads(), 1.0, "endpoint changes never reload");
    assert_eq!(c.worker_pids(), workers);

    api.apply_yaml(&ingress("two", "two.test", "/", "web", &[]));
    assert!(
        wait_until(Duration::from_secs(10), || c.get("two.test", "/").0 == 200),
        "{}",
        c.log()
    );
    assert_eq!(c.reloads_reaching(2.0), 2.0, "a new host reloads exactly once");

    api.delete("Ingress", "demo", "two");
    assert!(
        wait_until(Duration::from_secs(10), || c.get("two.test", "/").0 == 404),
        "{}",
        c.log()
    );
}

#[test]
fn controller_converges_after_cut_watches_410_and_500s() {
    let api = FakeApiServer::start();
    let (a, b) = (Upstream::start(), Upstream::start());
    setup(&api, &[a.port]);
    let c = Controller::start_on_cluster(&api.kubeconfig(), &[]);
    assert_eq!(c.get("web.test", "/").1, a.identity);

    // A cut watch: the watcher re-watches from its last rv and sees later changes.
    api.cut_watches();
    set_endpoints(&api, "web", &[b.port]);
    assert!(
        wait_until(Duration::from_secs(15), || c.seen("web.test", "/", 4)
            == BTreeSet::from([b.identity.clone()])),
        "{}",
        c.log()
    );

    // Compaction while the watches are down: the re-watch gets 410 Expired,
    // the watcher re-lists, and the state converges.
    let lists = api.lists();
    api.compact();
    api.cut_watches();
    set_endpoints(&api, "web", &[a.port]);
    assert!(
        wait_until(Duration::from_secs(20), || c.seen("web.test", "/", 4)
            == BTreeSet::from([a.identity.clone()])),
        "{}",
        c.log()
    );
    assert!(api.expired_sent() >= 1, "the fake sent 410");
    // The re-list follows the watcher's backoff.
    assert!(
        wait_until(Duration::from_secs(10), || api.lists() > lists),
        "the controller re-listed after 410"
    );

    // 500s on every request for a while: backoff, then convergence.
    api.fail_next(20);
    api.cut_watches();
    set_endpoints(&api, "web", &[b.port]);
    assert!(
        wait_until(Duration::from_secs(30), || c.seen("web.test", "/", 4)
            == BTreeSet::from([b.identity.clone()])),
        "{}",
        c.log()
    );
    assert_eq!(c.reloads(), 1.0, "none of this reloads nginx");
}

#[test]
fn controller_tolerates_a_slow_apiserver() {
    let api = FakeApiServer::start();
    let a = Upstream::start();
    setup(&api, &[a.port]);
    api.set_delay(Duration::from_millis(300));
    let c = Controller::start_on_cluster(&api.kubeconfig(), &[]);
    assert_eq!(c.get("web.test", "/").1, a.identity);
}

#[test]
fn refused_values_and_reloads_are_recorded_as_events() {
    let api = FakeApiServer::start();
    let a = Upstream::start();
    setup(&api, &[a.port]);
    api.apply_yaml(&ingress(
        "bad",
        "bad.test",
        "/",
        "web",
        &[("proxy-read-timeout", "soon")],
    ));
    let c = Controller::start_on_cluster(&api.kubeconfig(), &[]);
    assert_eq!(
        c.get("bad.test", "/").1,
        a.identity,
        "a bad annotation drops only itself"
    );
    let found = |reason: &str, kind: &str, name: &str| {
        api.objects("Event")
            .iter()
            .any(|e| e["reason"] == reason && e["regarding"]["kind"] == kind && e["regarding"]["name"] == name)
    };
    assert!(
        wait_until(Duration::from_secs(10), || found("InvalidValue", "Ingress", "bad")),
        "events: {:?}\n{}",
        api.objects("Event"),
        c.log()
    );
    let note = api
        .objects("Event")
        .into_iter()
        .find(|e| e["reason"] == "InvalidValue")
        .unwrap()["note"]
        .clone();
    assert!(note.as_str().unwrap().contains("proxy-read-timeout"), "{note}");
    assert!(wait_until(Duration::from_secs(10), || found(
        "RELOAD",
        "Pod",
        "ingress-controller-e2e"
    )));
}

/// In a cluster, what a tenant cannot do is said on the tenant's own
/// objects: a Warning on the Service whose ExternalName is the local host,
/// and on the Ingress whose access control fails closed.
#[test]
fn hostile_objects_get_warning_events_on_themselves() {
    let api = FakeApiServer::start();
    let a = Upstream::start();
    setup(&api, &[a.port]);
    api.apply_yaml(
        "apiVersion: v1\nkind: Service\nmetadata: {namespace: demo, name: sneaky}\nspec:\n  type: ExternalName\n  externalName: localhost\n  ports: [{name: http, port: 80}]\n",
    );
    api.apply_yaml(&ingress("sneaky", "sneaky.test", "/", "sneaky", &[]));
    api.apply_yaml(&ingress(
        "admin",
        "admin.test",
        "/",
        "web",
        &[("auth-url", "http://169.254.169.254/latest/meta-data/")],
    ));
    let c = Controller::start_on_cluster(&api.kubeconfig(), &[]);
    assert_eq!(c.get("sneaky.test", "/").0, 503);
    assert_eq!(c.get("admin.test", "/").0, 503);
    assert_eq!(c.get("web.test", "/").1, a.identity);
    let note = |kind: &str, name: &str| {
        api.objects("Event")
            .into_iter()
            .find(|e| e["reason"] == "InvalidValue" && e["regarding"]["kind"] == kind && e["regarding"]["name"] == name)
            .map(|e| e["note"].as_str().unwrap_or("").to_string())
    };
    assert!(
        wait_until(Duration::from_secs(10), || note("Service", "sneaky").is_some()
            && note("Ingress", "admin").is_some()),
        "events: {:?}\n{}",
        api.objects("Event"),
        c.log()
    );
    assert!(note("Service", "sneaky").unwrap().contains("a name of the local host"));
    assert!(note("Ingress", "admin").unwrap().contains("fails closed"));
}
