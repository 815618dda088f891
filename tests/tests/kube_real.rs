//! The controller against a real kube-apiserver 1.20 with etcd (see
//! `tests/src/kube_apiserver.rs` and `tests/kube-apiserver/build.sh`), with
//! real nginx and upstreams behind it.

use std::collections::BTreeSet;
use std::time::Duration;

use tests::controller::{
    alternate_endpoints, ingress, service, set_endpoints, wait_until, Cluster, Controller, INGRESS_CLASS,
};
use tests::kube_apiserver::RealApiServer;
use tests::upstream::Upstream;

#[test]
fn controller_on_a_real_apiserver() {
    let mut api = RealApiServer::start();
    let ups: Vec<Upstream> = (0..3).map(|_| Upstream::start()).collect();
    api.apply_yaml(INGRESS_CLASS);
    api.apply_yaml(&service("web", &[ups[0].port]));
    api.apply_yaml(&ingress("web", "web.test", "/", "web", &[]));
    let c = Controller::start_on_cluster(&api.kubeconfig(), &[]);
    assert_eq!(c.get("web.test", "/").1, ups[0].identity, "{}", c.log());
    let workers = c.worker_pids();

    // Scale the Service's EndpointSlices up and down: traffic follows, no reload.
    alternate_endpoints(&api, &c, &ups, 50, Duration::from_secs(15));
    assert_eq!(c.reloads(), 1.0, "endpoint changes never reload");
    assert_eq!(c.worker_pids(), workers);

    // The apiserver restarts: every watch is cut; the controller re-watches
    // (or re-lists) and follows the next change, still without a reload.
    api.restart();
    set_endpoints(&api, "web", &[ups[2].port]);
    let want = BTreeSet::from([ups[2].identity.clone()]);
    assert!(
        wait_until(Duration::from_secs(30), || c.seen("web.test", "/", 6) == want),
        "after restart\n{}",
        c.log()
    );
    assert_eq!(c.reloads(), 1.0);

    // A new host: exactly one reload.
    api.apply_yaml(&ingress("two", "two.test", "/", "web", &[]));
    assert!(
        wait_until(Duration::from_secs(15), || c.get("two.test", "/").0 == 200),
        "{}",
        c.log()
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(c.reloads(), 2.0);

    // A bad annotation drops only itself; traffic is unaffected.
    api.apply_yaml(&ingress(
        "web",
        "web.test",
        "/",
        "web",
        &[("proxy-read-timeout", "soon")],
    ));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(c.get("web.test", "/").0, 200);

    // Deleting the Ingress: 404 from the default server.
    api.delete("Ingress", "demo", "two");
    assert!(
        wait_until(Duration::from_secs(15), || c.get("two.test", "/").0 == 404),
        "{}",
        c.log()
    );
}
