//! The controller as a multi-tenant edge, end to end: what one tenant's
//! Ingress, Service or EndpointSlice can do to the API, to other tenants'
//! traffic, and to everyone's reloads and pushes.

use std::time::Duration;

use tests::controller::{custom_template, ingress, ingress_in, service, wait_until, Controller, INGRESS_CLASS};
use tests::upstream::Upstream;

/// A Service `name` in `ns` whose EndpointSlice lists `endpoints`.
fn service_in(ns: &str, name: &str, endpoints: &[(&str, u16)]) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: {ns}, name: {name}}}\nspec:\n  ports: [{{name: http, port: 80}}]\n"
    );
    for (i, (addr, port)) in endpoints.iter().enumerate() {
        out.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: {ns}\n  name: {name}-{i}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: {}\nports: [{{name: http, port: {port}}}]\nendpoints: [{{addresses: [\"{addr}\"]}}]\n",
            if addr.contains(':') { "IPv6" } else { "IPv4" }
        ));
    }
    out
}

/// A Service of type ExternalName.
fn external_name(ns: &str, name: &str, target: &str, port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: {ns}, name: {name}}}\nspec:\n  type: ExternalName\n  externalName: {target:?}\n  ports: [{{name: http, port: 80, targetPort: {port}}}]\n"
    )
}

/// Requests that must never see the module's API answer.
fn never_the_api(answer: &(u16, String)) {
    assert!(
        !answer.1.contains("\"generation\"") && !answer.1.contains("\"endpoints\"") && !answer.1.contains("\"name\""),
        "the public port reached the API: {answer:?}"
    );
}

#[test]
fn no_service_or_endpoint_slice_routes_the_public_port_to_the_api() {
    let web = Upstream::start();
    let c = Controller::start_strict(&[("class.yaml", INGRESS_CLASS.into())], &[]);
    let api = c.api_port;
    let mut files = String::new();
    let attacks = [
        (
            "ext-localhost",
            external_name("evil", "ext-localhost", "localhost", api),
        ),
        ("ext-loopback", external_name("evil", "ext-loopback", "127.0.0.1", api)),
        ("ext-v6", external_name("evil", "ext-v6", "::1", api)),
        ("ext-hex", external_name("evil", "ext-hex", "0x7f000001", api)),
        (
            "ext-metadata",
            external_name("evil", "ext-metadata", "169.254.169.254", 80),
        ),
        (
            "slice-loopback",
            service_in("evil", "slice-loopback", &[("127.0.0.1", api)]),
        ),
        ("slice-any", service_in("evil", "slice-any", &[("0.0.0.0", api)])),
        ("slice-v6", service_in("evil", "slice-v6", &[("::1", api)])),
    ];
    for (name, svc) in &attacks {
        files.push_str(svc);
        files.push_str("---\n");
        files.push_str(&ingress_in(
            "evil",
            name,
            &format!("{name}.test"),
            "/",
            "Prefix",
            name,
            &[],
        ));
        files.push_str("---\n");
    }
    // The victim is on a real (non-local) address, so use the allowed path:
    // a second controller below checks the allowed mode.
    c.write("evil.yaml", &files);
    for (name, _) in &attacks {
        let host = format!("{name}.test");
        assert!(
            wait_until(Duration::from_secs(10), || c.get(&host, "/configuration/backends").0
                == 503),
            "{host}: {:?}\n{}",
            c.get(&host, "/configuration/backends"),
            c.log()
        );
        never_the_api(&c.get(&host, "/configuration/backends"));
    }
    let log = c.log();
    for needle in [
        "a name of the local host",
        "a loopback address",
        "an unspecified",
        "a link-local address",
        "in disguise",
    ] {
        assert!(log.contains(needle), "{needle}\n{log}");
    }
    drop(c);

    // Even with --allow-local-endpoints (a single-host manifest directory),
    // no endpoint may name the controller's own ports, and ExternalNames of
    // the local host stay refused.
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("web.yaml", service("web", &[web.port])),
            ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
        ],
        &[],
    );
    let evil = format!(
        "{}---\n{}---\n{}---\n{}",
        service_in("evil", "api", &[("127.0.0.1", c.api_port)]),
        ingress_in("evil", "api", "api.test", "/", "Prefix", "api", &[]),
        external_name("evil", "ext", "localhost", c.api_port),
        ingress_in("evil", "ext", "ext.test", "/", "Prefix", "ext", &[]),
    );
    c.write("evil.yaml", &evil);
    for host in ["api.test", "ext.test"] {
        assert!(
            wait_until(Duration::from_secs(10), || c.get(host, "/configuration/backends").0
                == 503),
            "{host}\n{}",
            c.log()
        );
        never_the_api(&c.get(host, "/configuration/backends"));
    }
    assert!(
        c.log().contains("on a port of the controller or nginx itself"),
        "{}",
        c.log()
    );
    assert_eq!(c.get("web.test", "/").1, web.identity, "the other tenant is unaffected");
}

/// A name in /etc/hosts that resolves to loopback (other than localhost,
/// which the controller refuses by name).
fn loopback_alias() -> Option<String> {
    let hosts = std::fs::read_to_string("/etc/hosts").ok()?;
    hosts
        .lines()
        .map(|l| {
            l.split('#')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|f| f.first().is_some_and(|a| a.starts_with("127.")))
        .flat_map(|f| f.into_iter().skip(1))
        .find(|n| !n.contains("localhost") && n.contains(char::is_alphabetic) && !n.ends_with('.'))
}

/// The controller cannot know what a name resolves to; the module refuses
/// it when it does (400). That backend alone is left out: the others are
/// pushed, later changes still apply, and the refusal is not retried.
#[test]
fn a_backend_the_module_refuses_holds_back_no_one_else() {
    let Some(alias) = loopback_alias() else {
        eprintln!("skipped: /etc/hosts has no loopback alias to resolve");
        return;
    };
    let (a, b) = (Upstream::start(), Upstream::start());
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("a.yaml", service("a", &[a.port])),
            ("ing-a.yaml", ingress("a", "a.test", "/", "a", &[])),
            (
                "evil.yaml",
                format!(
                    "{}---\n{}",
                    external_name("demo", "sneaky", &alias, 80),
                    ingress("sneaky", "sneaky.test", "/", "sneaky", &[])
                ),
            ),
        ],
        &[],
    );
    assert_eq!(c.get("a.test", "/").1, a.identity);
    assert_eq!(c.get("sneaky.test", "/").0, 503);
    assert!(
        wait_until(Duration::from_secs(5), || c
            .metric("nginx_ingress_controller_refused_backends")
            == 1.0),
        "{}",
        c.log()
    );
    assert!(
        c.log().contains("the module refused backend demo-sneaky-80"),
        "{}",
        c.log()
    );
    // Later changes for everyone else still go through, with no retry loop.
    c.write("a.yaml", &service("a", &[b.port]));
    assert!(
        wait_until(Duration::from_secs(10), || c.get("a.test", "/").1 == b.identity),
        "{}",
        c.log()
    );
    let pushes = c.log().matches("pushing backends failed").count();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        c.log().matches("pushing backends failed").count(),
        pushes,
        "no retry loop"
    );
    assert_eq!(pushes, 0, "{}", c.log());
}

#[test]
fn a_server_alias_never_takes_another_tenants_host() {
    let (victim, attacker) = (Upstream::start(), Upstream::start());
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            (
                "1-victim.yaml",
                format!(
                    "{}---\n{}",
                    service_in("team-a", "site", &[("127.0.0.1", victim.port)]),
                    ingress_in(
                        "team-a",
                        "site",
                        "victim.example.com",
                        "/",
                        "Prefix",
                        "site",
                        &[("server-alias", "www.victim.example.com")]
                    )
                ),
            ),
            (
                "2-attacker.yaml",
                format!(
                    "{}---\n{}",
                    service_in("team-b", "grab", &[("127.0.0.1", attacker.port)]),
                    // Sorted before victim.example.com, so nginx would keep it first.
                    ingress_in(
                        "team-b",
                        "grab",
                        "0.attacker.example",
                        "/",
                        "Prefix",
                        "grab",
                        &[(
                            "server-alias",
                            "victim.example.com, www.victim.example.com, attacker-alias.example"
                        )]
                    )
                ),
            ),
        ],
        &[],
    );
    assert_eq!(c.get("victim.example.com", "/").1, victim.identity);
    assert_eq!(c.get("www.victim.example.com", "/").1, victim.identity);
    assert_eq!(
        c.get("attacker-alias.example", "/").1,
        attacker.identity,
        "a free alias still works"
    );
    let log = c.log();
    assert!(
        log.contains("server-alias victim.example.com is a host of its own"),
        "{log}"
    );
    assert!(
        log.contains("server-alias www.victim.example.com is already an alias of host victim.example.com"),
        "{log}"
    );
    assert!(!c.conf().contains("server_name 0.attacker.example victim.example.com"));
}

#[test]
fn a_canary_only_attaches_within_its_namespace() {
    let (victim, thief, own) = (Upstream::start(), Upstream::start(), Upstream::start());
    let canary = [("canary", "true"), ("canary-weight", "100")];
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            (
                "1.yaml",
                format!(
                    "{}---\n{}",
                    service_in("team-a", "site", &[("127.0.0.1", victim.port)]),
                    ingress_in("team-a", "site", "shop.example.com", "/", "Prefix", "site", &[])
                ),
            ),
            (
                "2.yaml",
                format!(
                    "{}---\n{}",
                    service_in("team-b", "steal", &[("127.0.0.1", thief.port)]),
                    ingress_in("team-b", "steal", "shop.example.com", "/", "Prefix", "steal", &canary)
                ),
            ),
            (
                "3.yaml",
                format!(
                    "{}---\n{}",
                    service_in("team-c", "app", &[("127.0.0.1", own.port)]),
                    ingress_in("team-c", "app", "app.example.com", "/", "Prefix", "app", &[])
                ),
            ),
        ],
        &[],
    );
    assert_eq!(c.seen("shop.example.com", "/", 10), [victim.identity.clone()].into());
    assert!(
        c.log().contains("a canary only attaches within its namespace"),
        "{}",
        c.log()
    );
    // Within a namespace it still works.
    let mut canary_c = Upstream::start();
    canary_c.identity = canary_c.identity.clone();
    c.write(
        "4.yaml",
        &format!(
            "{}---\n{}",
            service_in("team-c", "app-canary", &[("127.0.0.1", canary_c.port)]),
            ingress_in(
                "team-c",
                "app-canary",
                "app.example.com",
                "/",
                "Prefix",
                "app-canary",
                &canary
            )
        ),
    );
    assert!(
        wait_until(Duration::from_secs(10), || c.seen("app.example.com", "/", 6)
            == [canary_c.identity.clone()].into()),
        "{}",
        c.log()
    );
}

#[test]
fn colliding_backend_names_still_route_to_their_own_services() {
    let (one, two, three) = (Upstream::start(), Upstream::start(), Upstream::start());
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("1.yaml", format!(
                "{}---\n{}",
                service_in("a-b", "c", &[("127.0.0.1", one.port)]),
                ingress_in("a-b", "one", "one.test", "/", "Prefix", "c", &[])
            )),
            ("2.yaml", format!(
                "{}---\n{}",
                service_in("a", "b-c", &[("127.0.0.1", two.port)]),
                ingress_in("a", "two", "two.test", "/", "Prefix", "b-c", &[])
            )),
            // Named like the catch-all backend (namespace upstream, Service
            // default, port "backend").
            ("3.yaml", format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{namespace: upstream, name: default}}\nspec:\n  ports: [{{name: backend, port: 80}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: upstream\n  name: default-0\n  labels: {{kubernetes.io/service-name: default}}\naddressType: IPv4\nports: [{{name: backend, port: {}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{namespace: upstream, name: three}}\nspec:\n  ingressClassName: nginx\n  rules:\n    - host: three.test\n      http:\n        paths:\n          - path: /\n            pathType: Prefix\n            backend: {{service: {{name: default, port: {{name: backend}}}}}}\n",
                three.port
            )),
        ],
        &[],
    );
    assert_eq!(c.get("one.test", "/").1, one.identity);
    assert_eq!(c.get("two.test", "/").1, two.identity);
    assert_eq!(c.get("three.test", "/").1, three.identity);
    assert_eq!(c.get("unknown.test", "/").0, 404, "the catch-all is not the tenant's");
    let backends = c.api_get("/configuration/backends").unwrap().1;
    assert!(backends.contains("\"a-b-c-80\""), "{backends}");
    assert!(
        backends.contains("\"a-b-c-80-"),
        "the later one gets a suffix: {backends}"
    );
}

/// Values nginx would refuse used to fail `nginx -t` and hold back every
/// reload while the Ingress existed. Now each is refused on its own.
#[test]
fn values_nginx_would_refuse_hold_back_no_reload() {
    let a = Upstream::start();
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("a.yaml", service("a", &[a.port])),
            ("ing.yaml", ingress("base", "base.test", "/", "a", &[])),
        ],
        &[],
    );
    let reloads = c.reloads();
    let bad = format!(
        "{}---\n{}---\n{}---\napiVersion: v1\nkind: Secret\nmetadata: {{namespace: demo, name: fake}}\ntype: kubernetes.io/tls\nstringData: {{tls.crt: \"-----BEGIN CERTIFICATE-----\\nAAAA\\n-----END CERTIFICATE-----\\n\", tls.key: \"-----BEGIN PRIVATE KEY-----\\nAAAA\\n-----END PRIVATE KEY-----\\n\"}}\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{namespace: demo, name: tls}}\nspec:\n  ingressClassName: nginx\n  tls: [{{hosts: [tls.test], secretName: fake}}]\n  rules:\n    - host: tls.test\n      http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: a, port: {{number: 80}}}}}}}}]}}\n",
        ingress(
            "limits",
            "limits.test",
            "/",
            "a",
            &[
                ("limit-connections", "65536"),
                ("proxy-body-size", "999999999999g"),
                ("custom-http-errors", "404,499"),
                ("limit-rps", "0"),
            ]
        ),
        ingress_in("demo", "regex", "regex.test", "/a(?u)b", "ImplementationSpecific", "a", &[("use-regex", "true")]),
        ingress_in("demo", "dup", "limits.test", "/x/", "ImplementationSpecific", "a", &[]),
    );
    let before = c.worker_pids();
    c.write("bad.yaml", &bad);
    // And a second Ingress on that path, Prefix this time: it renders
    // "location /x/" too, which nginx refuses as a duplicate.
    c.write("dup.yaml", &ingress("dup2", "limits.test", "/x", "a", &[]));
    c.write("new.yaml", &ingress("new", "new.test", "/", "a", &[]));
    assert!(
        wait_until(Duration::from_secs(10), || c.get("new.test", "/").1 == a.identity),
        "a new host is served despite the bad values\n{}",
        c.log()
    );
    assert_eq!(
        c.metric("nginx_ingress_controller_errors"),
        0.0,
        "nginx -t never failed\n{}",
        c.log()
    );
    // New workers serve the new host a moment before the controller, which
    // waits for all of them to report, counts the reload.
    assert!(
        wait_until(Duration::from_secs(5), || c.reloads() > reloads),
        "{}",
        c.log()
    );
    // An old worker that has not yet taken its quit signal can still
    // accept a connection for a moment after the new ones report (CI saw
    // one 404 from the old configuration), so the checks wait for the old
    // generation to be gone.
    assert!(c.wait_workers_gone(&before), "old workers linger\n{}", c.log());
    assert_eq!(
        c.get("limits.test", "/"),
        (200, a.identity.clone()),
        "the Ingress itself still works\n{}\n{}",
        c.conf(),
        c.log()
    );
    assert_eq!(c.get("limits.test", "/x/y"), (200, a.identity.clone()), "{}", c.conf());
    let log = c.log();
    for needle in [
        "limit-connections must be a whole number from 0 to 65535",
        "larger than nginx can hold",
        "not an error status nginx accepts",
        "does not compile with PCRE2",
        "tls.crt is not a PEM certificate chain",
        "renders location /x/, which Ingress demo/dup already has",
    ] {
        assert!(log.contains(needle), "{needle}\n{log}");
    }
}

/// A template that writes a directive nginx refuses into the location of
/// an Ingress with `proxy-read-timeout: "123"`: a value that slipped past
/// validation, as far as nginx can tell.
fn poisoned_template(dir: &std::path::Path) -> std::path::PathBuf {
    custom_template(dir, |base| {
        base.replacen(
            "            dynamic_balancer_backend {{ l.backend }};",
            "{% if l.proxy_read_timeout == 123 %}\n            no_such_directive on;\n{% endif %}\n            dynamic_balancer_backend {{ l.backend }};",
            1,
        )
    })
}

/// The first configuration is started without a separate `nginx -t`: when
/// nginx refuses it, the master exits, the supervisor leaves it alone, and
/// the controller tests, quarantines the Ingress nginx blames and starts
/// nginx on the rest.
#[test]
fn an_ingress_nginx_refuses_at_startup_is_quarantined_before_the_first_start() {
    let a = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let template = poisoned_template(dir.path());
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("a.yaml", service("a", &[a.port])),
            ("ok.yaml", ingress("ok", "ok.test", "/", "a", &[])),
            (
                "bad.yaml",
                ingress("bad", "bad.test", "/", "a", &[("proxy-read-timeout", "123")]),
            ),
        ],
        &["--template", template.to_str().unwrap()],
    );
    assert_eq!(c.get("ok.test", "/").1, a.identity, "{}", c.log());
    assert_eq!(c.get("bad.test", "/").0, 404, "{}", c.log());
    assert_eq!(c.metric("nginx_ingress_controller_quarantined_ingresses"), 1.0);
    // The failed start was the controller's to handle: no restart loop.
    assert_eq!(
        c.metric("nginx_ingress_controller_nginx_restarts_total"),
        0.0,
        "{}",
        c.log()
    );
    let log = c.log();
    assert!(log.contains("nginx exited on its first configuration"), "{log}");
    assert!(log.contains("demo/bad") && log.contains("no_such_directive"), "{log}");
}

/// A template that breaks on a given value stands in for any value that
/// slips past validation: nginx refuses the configuration, the Ingresses
/// responsible are found and quarantined, and everything else is applied.
#[test]
fn ingresses_nginx_refuses_are_quarantined_and_the_rest_applied() {
    let a = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let template = poisoned_template(dir.path());
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("a.yaml", service("a", &[a.port])),
            ("ing.yaml", ingress("base", "base.test", "/", "a", &[])),
        ],
        &["--template", template.to_str().unwrap()],
    );
    let poison = [("proxy-read-timeout", "123")];
    let mut batch = String::new();
    for i in 0..12 {
        let ann: &[(&str, &str)] = if i == 3 || i == 9 { &poison } else { &[] };
        batch.push_str(&ingress(&format!("t{i}"), &format!("t{i}.test"), "/", "a", ann));
        batch.push_str("---\n");
    }
    c.write("batch.yaml", &batch);
    assert!(
        wait_until(Duration::from_secs(30), || c.get("t11.test", "/").1 == a.identity),
        "{}",
        c.log()
    );
    assert!(
        wait_until(Duration::from_secs(10), || c
            .metric("nginx_ingress_controller_quarantined_ingresses")
            == 2.0),
        "{}",
        c.log()
    );
    // The last Ingress served and the count right do not say the reload
    // that left the two out is the one serving: wait for every host.
    let states = || -> Vec<u16> { (0..12).map(|i| c.get(&format!("t{i}.test"), "/").0).collect() };
    let want: Vec<u16> = (0..12).map(|i| if i == 3 || i == 9 { 404 } else { 200 }).collect();
    assert!(
        wait_until(Duration::from_secs(10), || states() == want),
        "{:?}\n{}",
        states(),
        c.log()
    );
    let log = c.log();
    assert!(
        log.contains("demo/t3") && log.contains("demo/t9") && log.contains("quarantined"),
        "{log}"
    );
    assert!(log.contains("no_such_directive"), "{log}");
    // Fixing one lifts its quarantine.
    c.write("batch.yaml", &batch.replacen("\"123\"", "\"124\"", 1));
    assert!(
        wait_until(Duration::from_secs(10), || c.get("t3.test", "/").1 == a.identity),
        "{}",
        c.log()
    );
    assert!(
        wait_until(Duration::from_secs(5), || c
            .metric("nginx_ingress_controller_quarantined_ingresses")
            == 1.0),
        "{}\n{}",
        c.metric("nginx_ingress_controller_quarantined_ingresses"),
        c.log()
    );
    assert_eq!(c.get("t9.test", "/").0, 404);
}

#[test]
fn fails_closed_fails_closed() {
    let a = Upstream::start();
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("a.yaml", service("a", &[a.port])),
            ("open.yaml", ingress("open", "site.test", "/", "a", &[])),
            (
                "basic.yaml",
                ingress(
                    "admin",
                    "site.test",
                    "/admin",
                    "a",
                    &[("auth-type", "basic"), ("auth-secret", "htpasswd")],
                ),
            ),
            (
                "ext.yaml",
                ingress(
                    "ext",
                    "ext.test",
                    "/",
                    "a",
                    &[("auth-url", "http://169.254.169.254/latest/meta-data/")],
                ),
            ),
        ],
        &[],
    );
    assert_eq!(c.get("site.test", "/admin").0, 503, "never the unprotected backend");
    assert_eq!(c.get("site.test", "/admin/users").0, 503);
    assert_eq!(c.get("ext.test", "/").0, 503);
    assert_eq!(c.get("site.test", "/").1, a.identity, "other paths are unaffected");
    assert!(c.log().contains("fails closed"), "{}", c.log());
}

#[test]
fn cookie_affinity_issues_its_cookie_through_the_controller() {
    let ups: Vec<Upstream> = (0..3).map(|_| Upstream::start()).collect();
    let ports: Vec<u16> = ups.iter().map(|u| u.port).collect();
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("web.yaml", service("web", &ports)),
            (
                "ing.yaml",
                ingress(
                    "web",
                    "web.test",
                    "/app",
                    "web",
                    &[("affinity", "cookie"), ("session-cookie-name", "SESSION")],
                ),
            ),
        ],
        &[],
    );
    let agent = tests::agent();
    let mut r = agent
        .get(&format!("http://127.0.0.1:{}/app/x", c.http_port))
        .header("Host", "web.test")
        .call()
        .unwrap();
    let set_cookie = r.headers().get("set-cookie").map(|v| v.to_str().unwrap().to_string());
    let first = r.body_mut().read_to_string().unwrap();
    let set_cookie = set_cookie.unwrap_or_else(|| panic!("no Set-Cookie\n{}\n{}", c.conf(), c.log()));
    assert!(set_cookie.starts_with("SESSION="), "{set_cookie}");
    assert!(
        set_cookie.contains("Path=/app"),
        "the Ingress path, as ingress-nginx sets it: {set_cookie}"
    );
    let cookie = set_cookie.split(';').next().unwrap().to_string();
    for _ in 0..10 {
        let mut r = agent
            .get(&format!("http://127.0.0.1:{}/app/y", c.http_port))
            .header("Host", "web.test")
            .header("Cookie", &cookie)
            .call()
            .unwrap();
        assert!(r.headers().get("set-cookie").is_none());
        assert_eq!(r.body_mut().read_to_string().unwrap(), first, "the session sticks");
    }
}

#[test]
fn real_world_manifests_that_used_to_break() {
    let (one, two, three) = (Upstream::start(), Upstream::start(), Upstream::start());
    // A valid 54-character host name overflowed nginx's default
    // server_names_hash_bucket_size (64) and failed the whole configuration.
    let long_host = "my-service-name.my-team-namespace.apps.example-corp.io";
    assert_eq!(long_host.len(), 54);
    let regex = [("use-regex", "true")];
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            (
                "svc.yaml",
                format!(
                    "{}---\n{}---\n{}",
                    service("one", &[one.port]),
                    service("two", &[two.port]),
                    service("three", &[three.port])
                ),
            ),
            ("long.yaml", ingress("long", long_host, "/", "one", &[])),
            // ingress-nginx's path-matching guide: on a host in regex mode,
            // /foo/bar, /foo/bar/ and /foo/bar/(.+) go to three services.
            (
                "paths.yaml",
                format!(
                    "{}---\n{}---\n{}",
                    ingress_in("demo", "p1", "test.com", "/foo/bar", "Prefix", "one", &regex),
                    ingress_in("demo", "p2", "test.com", "/foo/bar/", "Prefix", "two", &regex),
                    ingress_in(
                        "demo",
                        "p3",
                        "test.com",
                        "/foo/bar/(.+)",
                        "ImplementationSpecific",
                        "three",
                        &[("rewrite-target", "/$1")]
                    )
                ),
            ),
        ],
        &[],
    );
    assert_eq!(c.get(long_host, "/").1, one.identity, "{}", c.log());
    assert_eq!(c.get("test.com", "/foo/bar/1").1, three.identity);
    assert_eq!(c.get("test.com", "/foo/bar/").1, two.identity);
    assert_eq!(c.get("test.com", "/foo/bar").1, one.identity);
    // upstream-hash-by-subset with ingress-nginx's default size 3 and a
    // Service of one endpoint panicked in the peer hook.
    c.write(
        "subset.yaml",
        &ingress(
            "subset",
            "subset.test",
            "/",
            "one",
            &[
                ("upstream-hash-by", "$request_uri"),
                ("upstream-hash-by-subset", "true"),
            ],
        ),
    );
    assert!(
        wait_until(Duration::from_secs(10), || c.get("subset.test", "/x").1 == one.identity),
        "{}",
        c.log()
    );
    assert_eq!(c.metric("nginx_ingress_controller_errors"), 0.0, "{}", c.log());
}
