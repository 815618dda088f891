//! The controller against a real kube-apiserver 1.36 with etcd 3.5 (see
//! `tests/src/kube_apiserver.rs` and `tests/kube/build.sh`), with real nginx
//! and upstreams behind it. Authorization is RBAC: every controller here runs
//! with a TokenRequest token of the chart's ServiceAccount, so only what the
//! chart grants works.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::controller::{
    alternate_endpoints, ingress, service_at, set_endpoints_at, wait_until, Cluster, Controller, INGRESS_CLASS, STRICT,
};
use tests::kube_apiserver::{ChartIdentity, RealApiServer, CHART_FULLNAME, RELEASE_NAMESPACE};
use tests::pod_network::POD_IP;
use tests::upstream::Upstream;

/// Upstreams on the pod network: a real apiserver refuses loopback
/// endpoints, and the controller runs with its default address policy.
fn pods(n: usize) -> Vec<Upstream> {
    (0..n).map(|_| Upstream::start_in_pod_network()).collect()
}

fn service(name: &str, ports: &[u16]) -> String {
    service_at(POD_IP, name, ports)
}

/// The chart's flags, strict about endpoints, plus `extra`.
fn flags<'a>(id: &'a ChartIdentity, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = id.args();
    v.push(STRICT);
    v.extend_from_slice(extra);
    v
}

#[test]
fn controller_on_a_real_apiserver() {
    let mut api = RealApiServer::start();
    let id = api.install_chart(&[]);
    let ups = pods(3);
    api.apply_yaml(INGRESS_CLASS);
    api.apply_yaml(&service("web", &[ups[0].port]));
    api.apply_yaml(&ingress("web", "web.test", "/", "web", &[]));
    let c = Controller::start_on_cluster(&id.kubeconfig, &flags(&id, &[]));
    assert_eq!(c.get("web.test", "/").1, ups[0].identity, "{}", c.log());
    let workers = c.worker_pids();

    // Scale the Service's EndpointSlices up and down: traffic follows, no reload.
    alternate_endpoints(&api, &c, &ups, 50, Duration::from_secs(15));
    assert_eq!(c.reloads(), 1.0, "endpoint changes never reload");
    assert_eq!(c.worker_pids(), workers);

    // Everything so far ran on the chart's RBAC without a refusal. (Right
    // after the restart below, a watch may meet a 403 while the new
    // apiserver's RBAC cache fills; the watcher retries, as in a cluster.)
    assert!(
        !c.log().contains("forbidden"),
        "the chart's RBAC refused something the controller does:\n{}",
        c.log()
    );

    // The apiserver restarts: every watch is cut; the controller re-watches
    // (or re-lists) and follows the next change, still without a reload.
    api.restart();
    set_endpoints_at(&api, POD_IP, "web", &[ups[2].port]);
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

    // A bad annotation drops only itself; traffic is unaffected, and the
    // Warning Event (written with the chart's RBAC) names it.
    api.apply_yaml(&ingress(
        "web",
        "web.test",
        "/",
        "web",
        &[("proxy-read-timeout", "soon")],
    ));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(c.get("web.test", "/").0, 200);
    assert!(
        wait_until(Duration::from_secs(10), || {
            let (_, events) = api.get("/apis/events.k8s.io/v1/namespaces/demo/events");
            events["items"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["reason"] == "InvalidValue" && e["regarding"]["name"] == "web" && e["type"] == "Warning")
        }),
        "no InvalidValue Event on the Ingress\n{}",
        c.log()
    );

    // Deleting the Ingress: 404 from the default server.
    api.delete("Ingress", "demo", "two");
    assert!(
        wait_until(Duration::from_secs(15), || c.get("two.test", "/").0 == 404),
        "{}",
        c.log()
    );
}

/// Every object the chart renders, with its defaults and with the main
/// variants, is accepted by a 1.36 apiserver (server-side dry run, then
/// stored); `helm lint` passes.
#[test]
fn the_chart_applies_to_kubernetes_1_36() {
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/helm/dynamic-balancer");
    let out = tests::kube_apiserver::helm()
        .args(["lint", "--strict", chart])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm lint: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let api = RealApiServer::start();
    api.kubectl(&["create", "namespace", RELEASE_NAMESPACE], None);
    api.kubectl(&["create", "namespace", "tenants"], None);
    let variants: &[&[&str]] = &[
        &[],
        &[
            "controller.kind=DaemonSet",
            "controller.service.type=NodePort",
            "controller.hostNetwork=true",
            "controller.config.use-forwarded-headers=true",
            "controller.config.worker-processes=2",
            "controller.extraArgs.reload-settle-ms=500",
        ],
        &[
            "controller.replicaCount=3",
            "controller.scope.enabled=true",
            "controller.scope.namespace=tenants",
            "controller.metrics.enabled=true",
            "controller.ingressClassResource.default=true",
        ],
        &[
            "tcp.5432=db/postgres:5432",
            "tcp.1883=mq/mqtt:1883:PROXY",
            "udp.53=kube-system/kube-dns:53",
            "controller.extraArgs.enable-ssl-passthrough=true",
        ],
    ];
    for (i, sets) in variants.iter().enumerate() {
        let release = format!("r{i}");
        let yaml = tests::kube_apiserver::helm_template(&release, RELEASE_NAMESPACE, sets);
        let yaml = if i > 0 {
            // One IngressClass named nginx is enough; the others would
            // only collide with the first release's.
            yaml.split("\n---\n")
                .filter(|d| !d.contains("kind: IngressClass"))
                .collect::<Vec<_>>()
                .join("\n---\n")
        } else {
            yaml
        };
        api.apply_manifests(&yaml);
    }
    let (ok, out) = api.kubectl(
        &[
            "get",
            "deploy,ds,svc,validatingwebhookconfigurations,pdb,role,clusterrole",
            "-A",
            "-o",
            "name",
        ],
        None,
    );
    assert!(ok, "{out}");
    for want in [
        "deployment.apps/r0-dynamic-balancer-controller",
        "daemonset.apps/r1-dynamic-balancer-controller",
        "service/r2-dynamic-balancer-controller-metrics",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/r0-dynamic-balancer-admission",
        "poddisruptionbudget.policy/r2-dynamic-balancer-controller",
        "service/r3-dynamic-balancer-controller",
    ] {
        assert!(out.contains(want), "{want} missing:\n{out}");
    }

    // The static manifests (their own namespace, every object) apply too.
    let static_yaml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/static/dynamic-balancer.yaml"
    ))
    .unwrap();
    // A server-side dry run does not create the Namespace its first
    // document declares, so the namespaced objects need it beforehand.
    api.kubectl(&["create", "namespace", "dynamic-balancer"], None);
    api.apply_manifests(&static_yaml);

    // The ServiceMonitor needs the Prometheus Operator's CRD, which this
    // apiserver does not have: rendered and checked, not applied.
    let sm = tests::kube_apiserver::helm_template(
        "m",
        RELEASE_NAMESPACE,
        &[
            "controller.metrics.enabled=true",
            "controller.metrics.serviceMonitor.enabled=true",
        ],
    );
    assert!(
        sm.contains("kind: ServiceMonitor") && sm.contains("port: metrics"),
        "{sm}"
    );
    // A wrong kind is refused by the chart itself.
    let out = tests::kube_apiserver::helm()
        .args(["template", "x", chart, "--set", "controller.kind=StatefulSet"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Deployment or DaemonSet"));
}

/// `deploy/static/` is what `deploy/static/render.sh` makes of the chart
/// now: a change to the chart without rendering again fails here.
#[test]
fn static_manifests_match_the_chart() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("fresh.yaml");
    let out = std::process::Command::new(format!("{root}/deploy/static/render.sh"))
        .env("STATIC_OUT", &fresh)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let committed = std::fs::read_to_string(format!("{root}/deploy/static/dynamic-balancer.yaml")).unwrap();
    let fresh = std::fs::read_to_string(&fresh).unwrap();
    if committed != fresh {
        let first = committed
            .lines()
            .zip(fresh.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(fresh.lines().count()));
        panic!(
            "deploy/static/dynamic-balancer.yaml drifted from the chart (first difference at line {}): run deploy/static/render.sh",
            first + 1
        );
    }
}

/// What the chart's identity may not do: write Ingress specs, read single
/// Secrets, create or delete anything it only watches, take another Lease,
/// read ConfigMaps other than its own; and, scoped to a namespace, list
/// Secrets elsewhere. What it needs works.
#[test]
fn rbac_denies_what_the_controller_does_not_need() {
    let api = RealApiServer::start();
    let id = api.install_chart(&[]);
    api.apply_yaml(INGRESS_CLASS);
    api.apply_yaml(&service("web", &[18080]));
    api.apply_yaml(&ingress("web", "web.test", "/", "web", &[]));
    api.apply_yaml(
        "apiVersion: v1\nkind: Secret\nmetadata: {namespace: demo, name: db-password}\nstringData: {password: hunter2}\n",
    );
    let t = &id.token;
    let ing = "/apis/networking.k8s.io/v1/namespaces/demo/ingresses/web";
    let code = |method: &str, path: &str, body: Option<&Value>| api.call_as(t, method, path, body).0;
    let merge = |path: &str, body: &Value| {
        api.call_with(t, "PATCH", path, Some(body), "application/merge-patch+json")
            .0
    };

    // Allowed: what the controller does.
    assert_eq!(code("GET", "/apis/networking.k8s.io/v1/ingresses", None), 200);
    assert_eq!(code("GET", "/apis/discovery.k8s.io/v1/endpointslices", None), 200);
    assert_eq!(
        code("GET", "/api/v1/secrets?fieldSelector=type%3Dkubernetes.io%2Ftls", None),
        200
    );
    assert_eq!(
        merge(
            &format!("{ing}/status"),
            &json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}})
        ),
        200
    );
    let own_cm = format!(
        "/api/v1/namespaces/{RELEASE_NAMESPACE}/configmaps?fieldSelector=metadata.name%3D{CHART_FULLNAME}-controller"
    );
    assert_eq!(code("GET", &own_cm, None), 200);
    // The header sets of add-headers and proxy-set-headers: its own
    // namespace's ConfigMaps, and no other namespace's.
    let own_namespace = format!("/api/v1/namespaces/{RELEASE_NAMESPACE}/configmaps");
    assert_eq!(code("GET", &own_namespace, None), 200);

    // Denied.
    let denied: Vec<(&str, String, Option<Value>)> = vec![
        ("PATCH-spec", ing.to_string(), Some(json!({"spec": {"rules": []}}))),
        ("DELETE", ing.to_string(), None),
        ("GET", "/api/v1/namespaces/demo/secrets/db-password".into(), None),
        (
            "POST",
            "/api/v1/namespaces/demo/secrets".into(),
            Some(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}})),
        ),
        ("GET", "/api/v1/namespaces/kube-system/configmaps".into(), None),
        ("GET", "/api/v1/configmaps".into(), None),
        (
            "GET",
            format!("/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/leases/someone-elses"),
            None,
        ),
        ("GET", "/api/v1/pods".into(), None),
        ("GET", "/api/v1/nodes".into(), None),
        ("DELETE", "/apis/networking.k8s.io/v1/ingressclasses/nginx".into(), None),
    ];
    for (method, path, body) in &denied {
        let got = if *method == "PATCH-spec" {
            merge(path, body.as_ref().unwrap())
        } else {
            code(method, path, body.as_ref())
        };
        assert_eq!(got, 403, "{method} {path} should be forbidden");
    }
    let (_, obj) = api.get(ing);
    assert!(
        obj["spec"]["rules"].as_array().is_some_and(|r| !r.is_empty()),
        "the spec is untouched"
    );

    // Scoped to one namespace: Secrets elsewhere are out of reach, and a
    // controller with that identity still works in its namespace.
    let scoped = api.install_chart(&[
        "controller.scope.enabled=true",
        "controller.scope.namespace=demo",
        "rbac.create=true",
    ]);
    let st = &scoped.token;
    assert_eq!(
        api.call_as(
            st,
            "GET",
            "/api/v1/namespaces/demo/secrets?fieldSelector=type%3Dkubernetes.io%2Ftls",
            None
        )
        .0,
        200
    );
    assert_eq!(
        api.call_as(st, "GET", "/api/v1/namespaces/kube-system/secrets", None).0,
        403
    );
    assert_eq!(api.call_as(st, "GET", "/api/v1/secrets", None).0, 403);
    let up = Upstream::start_in_pod_network();
    api.apply_yaml(&service("web", &[up.port]));
    let c = Controller::start_on_cluster(&scoped.kubeconfig, &flags(&scoped, &["--watch-namespace=demo"]));
    assert_eq!(c.get("web.test", "/").1, up.identity, "{}", c.log());
}

fn lease_holder(api: &RealApiServer) -> Option<String> {
    let (_, lease) = api.get(&format!(
        "/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/leases/{CHART_FULLNAME}-leader"
    ));
    lease["spec"]["holderIdentity"].as_str().map(str::to_string)
}

fn published(api: &RealApiServer, name: &str) -> Vec<String> {
    let (_, ing) = api.get(&format!("/apis/networking.k8s.io/v1/namespaces/demo/ingresses/{name}"));
    let mut v: Vec<String> = ing["status"]["loadBalancer"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["ip"].as_str().or(i["hostname"].as_str()).map(str::to_string))
        .collect();
    v.sort();
    v
}

/// Two replicas: both serve, one leads and writes status; the leader is
/// killed and the other leads within the lease duration plus 2 s; the audit
/// log shows that status writes never came from both.
#[test]
fn one_leader_writes_status_and_another_takes_over() {
    let api = RealApiServer::start();
    let id = api.install_chart(&[]);
    let up = Upstream::start_in_pod_network();
    api.apply_yaml(INGRESS_CLASS);
    api.apply_yaml(&service("web", &[up.port]));
    api.apply_yaml(&ingress("web", "web.test", "/", "web", &[]));
    // Another class's Ingress: never touched.
    api.apply_yaml(
        &ingress("other", "other.test", "/", "web", &[]).replace("ingressClassName: nginx", "ingressClassName: other"),
    );
    let ttl = 4;
    let ttl_arg = format!("--election-ttl={ttl}s");
    let extra = flags(
        &id,
        &[ttl_arg.as_str(), "--publish-status-address=192.0.2.10,lb.example.test"],
    );
    // Two tokens, as two Pods each get their own.
    let kc_b = api.kubeconfig_with_token(&api.service_account_token(RELEASE_NAMESPACE, CHART_FULLNAME));
    let mut a = Controller::start_on_cluster_as(&id.kubeconfig, &extra, "ctl-a");
    let mut b = Controller::start_on_cluster_as(&kc_b, &extra, "ctl-b");
    assert_eq!(a.get("web.test", "/").1, up.identity);
    assert_eq!(b.get("web.test", "/").1, up.identity, "every replica serves");

    let want = vec!["192.0.2.10".to_string(), "lb.example.test".to_string()];
    assert!(
        wait_until(Duration::from_secs(20), || published(&api, "web") == want),
        "status not written: {:?}\nA:\n{}\nB:\n{}",
        published(&api, "web"),
        a.log(),
        b.log()
    );
    assert!(
        published(&api, "other").is_empty(),
        "another class's Ingress is left alone"
    );
    let leader = lease_holder(&api).expect("a Lease holder");
    assert!(leader == "ctl-a" || leader == "ctl-b", "{leader}");
    let (dead, alive, alive_name) = if leader == "ctl-a" {
        (&mut a, &b, "ctl-b")
    } else {
        (&mut b, &a, "ctl-a")
    };

    // The leader dies without releasing its Lease.
    dead.signal(libc::SIGKILL);
    let killed = Instant::now();
    assert!(
        wait_until(Duration::from_secs(ttl + 10), || lease_holder(&api).as_deref()
            == Some(alive_name)),
        "no takeover\n{}",
        alive.log()
    );
    let failover = killed.elapsed();
    eprintln!("failover after the leader was killed: {failover:?} (lease {ttl} s)");
    assert!(failover <= Duration::from_secs(ttl + 2), "failover took {failover:?}");

    // The new leader writes the status of a new Ingress.
    api.apply_yaml(&ingress("two", "two.test", "/", "web", &[]));
    assert!(
        wait_until(Duration::from_secs(15), || published(&api, "two") == want),
        "{}",
        alive.log()
    );

    // Who wrote status: one credential, then (after the kill) the other,
    // never interleaved.
    // The apiserver logs an event's ResponseComplete stage after the client
    // has its response, so the last write may reach the audit file a moment
    // after `published` saw it: read until both writes are there.
    let status_writers = || -> Vec<String> {
        api.audit_events()
            .iter()
            .filter(|e| e["objectRef"]["subresource"] == "status" && e["responseStatus"]["code"] == 200)
            .map(|e| e["user"]["extra"]["authentication.kubernetes.io/credential-id"].to_string())
            .collect()
    };
    wait_until(Duration::from_secs(5), || status_writers().len() >= 2);
    let writers = status_writers();
    assert!(
        writers.len() >= 2 && writers.iter().all(|w| w.contains("JTI")),
        "status writes without a token id: {writers:?}"
    );
    let mut runs = writers.clone();
    runs.dedup();
    assert!(runs.len() <= 2, "status writers interleaved: {writers:?}");

    // The last replica stops gracefully (--update-status-on-shutdown, on by
    // default): it empties the status it published and hands the Lease
    // back; the other class's Ingress is still untouched.
    let alive = if leader == "ctl-a" { &mut b } else { &mut a };
    alive.signal(libc::SIGTERM);
    assert!(
        wait_until(Duration::from_secs(15), || alive.exited().is_some()),
        "{}",
        alive.log()
    );
    assert!(
        published(&api, "web").is_empty() && published(&api, "two").is_empty(),
        "{:?}\n{}",
        published(&api, "web"),
        alive.log()
    );
    assert_eq!(lease_holder(&api), None, "the Lease is released");
}

/// The apiserver calls the webhook (TLS, certificate from `certgen`, CA
/// patched into the configuration by `certgen patch`): an Ingress with a
/// value the model refuses, or a snippet the snippet policy refuses, is
/// denied at create time with the reason; one only nginx would refuse is
/// admitted and quarantined; a good one is admitted.
#[test]
fn the_admission_webhook_refuses_bad_ingresses() {
    let api = RealApiServer::start();
    let id = api.install_chart(&[]);
    let up = Upstream::start_in_pod_network();
    api.apply_yaml(INGRESS_CLASS);
    api.apply_yaml(&service("web", &[up.port]));

    // certgen create: the Secret with a CA and a serving certificate.
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("admin.kubeconfig");
    std::fs::write(&kc, api.kubeconfig()).unwrap();
    let certgen = |args: &[&str]| {
        let out = std::process::Command::new(tests::controller::controller_binary())
            .arg("--kubeconfig")
            .arg(&kc)
            .arg("certgen")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "certgen {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let secret = "e2e-admission";
    certgen(&[
        "create",
        "--namespace",
        RELEASE_NAMESPACE,
        "--secret-name",
        secret,
        "--host",
        "127.0.0.1,localhost",
    ]);
    let (_, s) = api.get(&format!("/api/v1/namespaces/{RELEASE_NAMESPACE}/secrets/{secret}"));
    let b64 = |k: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(s["data"][k].as_str().unwrap())
            .unwrap()
    };
    std::fs::write(dir.path().join("cert"), b64("cert")).unwrap();
    std::fs::write(dir.path().join("key"), b64("key")).unwrap();
    // A second create keeps the first certificate.
    certgen(&[
        "create",
        "--namespace",
        RELEASE_NAMESPACE,
        "--secret-name",
        secret,
        "--host",
        "127.0.0.1",
    ]);
    let (_, again) = api.get(&format!("/api/v1/namespaces/{RELEASE_NAMESPACE}/secrets/{secret}"));
    assert_eq!(again["data"]["cert"], s["data"]["cert"]);

    let port = tests::free_port();
    let hook = format!("127.0.0.1:{port}");
    let cert = dir.path().join("cert").display().to_string();
    let key = dir.path().join("key").display().to_string();
    let (hook_arg, cert_arg, key_arg) = (
        format!("--validating-webhook={hook}"),
        format!("--validating-webhook-certificate={cert}"),
        format!("--validating-webhook-key={key}"),
    );
    let args = flags(
        &id,
        &[
            hook_arg.as_str(),
            cert_arg.as_str(),
            key_arg.as_str(),
            "--allow-snippet-annotations",
        ],
    );
    let c = Controller::start_on_cluster(&id.kubeconfig, &args);

    // Registered as the chart registers it, but by URL (no Service routing
    // here), without a caBundle: certgen patch sets it.
    let vwc = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "e2e-admission"},
        "webhooks": [{
            "name": "validate.dynamic-balancer.ingress",
            "matchPolicy": "Equivalent",
            "rules": [{"apiGroups": ["networking.k8s.io"], "apiVersions": ["v1"],
                       "operations": ["CREATE", "UPDATE"], "resources": ["ingresses"]}],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
            "clientConfig": {"url": format!("https://{hook}/networking/v1/ingresses")}
        }]
    });
    let (code, body) = api.call(
        "POST",
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
        Some(&vwc),
    );
    assert_eq!(code, 201, "{body}");
    certgen(&[
        "patch",
        "--namespace",
        RELEASE_NAMESPACE,
        "--secret-name",
        secret,
        "--webhook-name",
        "e2e-admission",
    ]);
    let (_, patched) = api.get("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/e2e-admission");
    assert_eq!(patched["webhooks"][0]["clientConfig"]["caBundle"], s["data"]["ca"]);

    let create = |yaml: &str| {
        let v: Value = serde_saphyr::from_str(yaml).unwrap();
        api.call("POST", "/apis/networking.k8s.io/v1/namespaces/demo/ingresses", Some(&v))
    };
    // The configuration reaches the apiserver's webhook cache within a
    // second or two: until then a bad Ingress may still pass.
    let bad = ingress("bad", "bad.test", "/", "web", &[("proxy-read-timeout", "soon")]);
    let mut refused = None;
    assert!(
        wait_until(Duration::from_secs(20), || {
            let (code, body) = create(&bad);
            if code == 201 {
                api.delete("Ingress", "demo", "bad");
                false
            } else {
                refused = Some((code, body));
                true
            }
        }),
        "a bad Ingress was never refused\n{}",
        c.log()
    );
    let (code, body) = refused.unwrap();
    let msg = body["message"].as_str().unwrap_or_default().to_string();
    assert!(
        (400..500).contains(&code) && msg.contains("denied the request") && msg.contains("proxy-read-timeout"),
        "{code} {body}"
    );

    // A snippet that leaves its block is refused by the snippet policy,
    // with the reason; nginx never sees it.
    let breakout = ingress(
        "breakout",
        "breakout.test",
        "/",
        "web",
        &[(
            "configuration-snippet",
            "} } } ssl_engine /tmp/evil.so; http { server { location /zz {",
        )],
    );
    let (code, body) = create(&breakout);
    let msg = body["message"].as_str().unwrap_or_default();
    assert!(
        code >= 400 && msg.contains("configuration-snippet") && msg.contains("not a complete list"),
        "{code} {body}"
    );
    // What only nginx could refuse (a directive it does not know) is no
    // longer caught at admission: the webhook runs no nginx on a caller's
    // Ingress. The controller tests it and quarantines it.
    let (code, body) = create(&ingress(
        "broken",
        "broken.test",
        "/",
        "web",
        &[("configuration-snippet", "no_such_directive on;")],
    ));
    assert_eq!(code, 201, "{body}");
    assert!(
        wait_until(Duration::from_secs(20), || c
            .metric("nginx_ingress_controller_quarantined_ingresses")
            == 1.0),
        "{}",
        c.log()
    );

    // A good one is admitted, and the webhook's latency is what it costs.
    let started = Instant::now();
    let (code, body) = create(&ingress("good", "good.test", "/", "web", &[]));
    let latency = started.elapsed();
    assert_eq!(code, 201, "{body}");
    eprintln!("admission of a good Ingress (the model): {latency:?}");
    assert!(
        wait_until(Duration::from_secs(15), || c.get("good.test", "/").0 == 200),
        "{}",
        c.log()
    );
    // What ingress-nginx admits stays admitted: an annotation this
    // controller does not implement, and a TLS Secret that does not exist
    // yet (cert-manager makes it after the Ingress).
    let pending = ingress(
        "pending",
        "pending.test",
        "/",
        "web",
        &[("enable-opentelemetry", "true")],
    )
    .replace(
        "spec:\n",
        "spec:\n  tls: [{hosts: [pending.test], secretName: not-yet}]\n",
    );
    let (code, body) = create(&pending);
    assert_eq!(code, 201, "{body}");
    // Except access control it does not implement: such an Ingress would
    // fail closed (503 on every path), so it is refused with that reason.
    let (code, body) = create(&ingress(
        "guarded",
        "guarded.test",
        "/",
        "web",
        &[("auth-url", "http://169.254.169.254/latest/meta-data/")],
    ));
    assert!(
        code == 400 && body["message"].as_str().unwrap_or("").contains("fails closed"),
        "{code} {body}"
    );

    // Another class is admitted without a review.
    let (code, body) = create(
        &ingress("elsewhere", "e.test", "/", "web", &[("proxy-read-timeout", "soon")])
            .replace("ingressClassName: nginx", "ingressClassName: other"),
    );
    assert_eq!(code, 201, "{body}");
}

/// EndpointSlices made by kube-controller-manager 1.36 from a Service's
/// selector and real Pod objects, whose IP and readiness are set through
/// the `status` subresource as a kubelet sets them: traffic follows Pod
/// readiness and deletion, with no reload.
#[test]
fn endpoint_slices_from_pods_follow_readiness() {
    use tests::pod_network::POD_IPS;
    let mut api = RealApiServer::start();
    api.start_controller_manager();
    let id = api.install_chart(&[]);
    let ips = &POD_IPS[4..7];
    // One port free on the three pod addresses: the Service's targetPort.
    let (port, pods) = (0..50)
        .find_map(|_| {
            let port = tests::free_port();
            let ups: Vec<Upstream> = ips
                .iter()
                .filter_map(|ip| Upstream::start_on_pod_ip(ip, port))
                .collect();
            (ups.len() == ips.len()).then_some((port, ups))
        })
        .expect("a port free on every pod address");
    let (code, body) = api.call(
        "POST",
        "/api/v1/nodes",
        Some(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}})),
    );
    assert_eq!(code, 201, "{body}");
    api.apply_yaml(INGRESS_CLASS);
    api.apply_yaml(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: demo, name: web}}\nspec:\n  selector: {{app: web}}\n  ports: [{{name: http, port: 80, targetPort: {port}}}]\n"
    ));
    api.apply_yaml(&ingress("web", "web.test", "/", "web", &[]));
    // The serviceaccount controller gives the namespace its default
    // ServiceAccount, without which no Pod is admitted.
    assert!(
        wait_until(Duration::from_secs(30), || api
            .get("/api/v1/namespaces/demo/serviceaccounts/default")
            .0
            == 200),
        "{}",
        api.controller_manager_log()
    );
    let set_ready = |name: &str, ip: &str, ready: bool| {
        let status = json!({"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": tests::pod_network::NODE_IP,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
        }});
        let (code, body) = api.call_with(
            "e2e-admin-token",
            "PATCH",
            &format!("/api/v1/namespaces/demo/pods/{name}/status"),
            Some(&status),
            "application/merge-patch+json",
        );
        assert_eq!(code, 200, "{body}");
    };
    for (i, ip) in ips.iter().enumerate() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("web-{i}"), "namespace": "demo", "labels": {"app": "web"}},
            "spec": {"nodeName": "node-1", "automountServiceAccountToken": false,
                     "containers": [{"name": "web", "image": "registry.example/web:1",
                                     "ports": [{"name": "http", "containerPort": port}]}]}});
        let (code, body) = api.call("POST", "/api/v1/namespaces/demo/pods", Some(&pod));
        assert_eq!(code, 201, "{body}");
        set_ready(&format!("web-{i}"), ip, true);
    }
    let c = Controller::start_on_cluster(&id.kubeconfig, &flags(&id, &[]));
    let all: BTreeSet<String> = pods.iter().map(|u| u.identity.clone()).collect();
    assert!(
        wait_until(Duration::from_secs(30), || c.seen("web.test", "/", 12) == all),
        "{:?}\n{}\n{}",
        c.seen("web.test", "/", 12),
        c.log(),
        api.controller_manager_log()
    );

    // A Pod turns unready: its endpoint leaves the slice, traffic follows.
    set_ready("web-1", ips[1], false);
    let without_1: BTreeSet<String> = [&pods[0], &pods[2]].iter().map(|u| u.identity.clone()).collect();
    assert!(
        wait_until(Duration::from_secs(20), || c.seen("web.test", "/", 12) == without_1),
        "{}",
        c.log()
    );
    // Ready again, then another Pod is deleted.
    set_ready("web-1", ips[1], true);
    assert!(wait_until(Duration::from_secs(20), || c.seen("web.test", "/", 12) == all));
    api.delete("Pod", "demo", "web-2");
    let without_2: BTreeSet<String> = pods[..2].iter().map(|u| u.identity.clone()).collect();
    assert!(
        wait_until(Duration::from_secs(20), || c.seen("web.test", "/", 12) == without_2),
        "{}",
        c.log()
    );
    assert_eq!(c.reloads(), 1.0, "Pod churn never reloads");
}

/// `--tcp-services-configmap` on a real apiserver: the chart's `tcp` value
/// makes the ConfigMap, the controller watches it (by name, with the
/// chart's RBAC), routes a TCP port to a Service on the pod network, and
/// follows an edit of the ConfigMap.
#[test]
fn tcp_services_from_the_chart_on_a_real_apiserver() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    let (p1, p2) = (tests::free_port(), tests::free_port());
    let api = RealApiServer::start();
    let id = api.install_chart(&[&format!("tcp.{p1}=demo/db:80")]);
    // A TCP upstream on the pod network that names itself.
    let listener = tests::pod_network::inside(move || TcpListener::bind(format!("{POD_IP}:0")).unwrap());
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let _ = conn.write_all(b"db-on-the-pod-network");
        }
    });
    api.apply_yaml(INGRESS_CLASS);
    api.apply_yaml(&service("db", &[port]));
    let configmap = format!("{RELEASE_NAMESPACE}/{CHART_FULLNAME}-controller-tcp");
    let tcp_flag = format!("--tcp-services-configmap={configmap}");
    let c = Controller::start_on_cluster(&id.kubeconfig, &flags(&id, &[&tcp_flag]));
    let ask = |p: u16| {
        let mut s = TcpStream::connect(("127.0.0.1", p)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        Some(answer)
    };
    assert!(
        wait_until(Duration::from_secs(15), || ask(p1).as_deref()
            == Some("db-on-the-pod-network")),
        "{}",
        c.log()
    );
    // An edit of the ConfigMap (a second port) is watched and applied.
    let cm = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"namespace": RELEASE_NAMESPACE, "name": format!("{CHART_FULLNAME}-controller-tcp")},
        "data": {p1.to_string(): "demo/db:80", p2.to_string(): "demo/db:80"},
    });
    api.apply_yaml(&serde_json::to_string(&cm).unwrap());
    assert!(
        wait_until(Duration::from_secs(15), || ask(p2).as_deref()
            == Some("db-on-the-pod-network")),
        "{}",
        c.log()
    );
    assert!(
        !c.log().contains("forbidden"),
        "the chart's RBAC refused something:\n{}",
        c.log()
    );
}

/// A layer-4 ConfigMap in a namespace the chart's RBAC does not cover: the
/// controller stops at once and says why, rather than waiting forever for
/// a watch that the apiserver refuses (with HTTP down meanwhile).
#[test]
fn a_tcp_services_configmap_it_may_not_read_stops_the_controller_with_the_reason() {
    let api = RealApiServer::start();
    let id = api.install_chart(&[]);
    api.kubectl(&["create", "namespace", "elsewhere"], None);
    let flag = "--tcp-services-configmap=elsewhere/tcp-services";
    let mut c = Controller::spawn_on_cluster(&id.kubeconfig, &flags(&id, &[flag]), "ingress-controller-e2e");
    let mut status = None;
    wait_until(Duration::from_secs(20), || {
        status = c.exited();
        status.is_some()
    });
    let Some(status) = status else {
        panic!("the controller kept running:\n{}", c.log())
    };
    let log = c.log();
    assert!(!status.success(), "a failed source must exit non-zero: {status}\n{log}");
    assert!(
        log.contains("may not list ConfigMaps in namespace elsewhere") && log.contains("--tcp-services-configmap"),
        "{log}"
    );
}
