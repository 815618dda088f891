//! End to end: the real controller on a manifest directory, driving the
//! real nginx + module, with real upstream servers.

use std::collections::BTreeSet;
use std::time::Duration;

use tests::controller::{custom_template, ingress, service, wait_until, Controller, INGRESS_CLASS};
use tests::upstream::Upstream;

#[test]
fn routes_by_host_and_path_and_a_deleted_ingress_gives_404() {
    let (a, b) = (Upstream::start(), Upstream::start());
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("a.yaml", service("a", &[a.port])),
            ("b.yaml", service("b", &[b.port])),
            ("ing.yaml", ingress("site", "site.test", "/", "a", &[])),
            ("ing-b.yaml", ingress("site-b", "site.test", "/b", "b", &[])),
        ],
        &[],
    );
    assert_eq!(c.get("site.test", "/"), (200, a.identity.clone()));
    assert_eq!(c.get("site.test", "/b/x"), (200, b.identity.clone()));
    assert_eq!(
        c.get("site.test", "/bx").1,
        a.identity,
        "Prefix matches whole path elements"
    );
    assert_eq!(
        c.get("other.test", "/").0,
        404,
        "unknown hosts go to the default server"
    );

    c.remove("ing-b.yaml");
    assert!(wait_until(Duration::from_secs(10), || c.get("site.test", "/b/x").1 == a.identity));
    c.remove("ing.yaml");
    assert!(
        wait_until(Duration::from_secs(10), || c.get("site.test", "/").0 == 404),
        "{}",
        c.log()
    );
}

#[test]
fn scaling_endpoints_50_times_never_reloads() {
    let ups: Vec<Upstream> = (0..3).map(|_| Upstream::start()).collect();
    let sets: [Vec<usize>; 2] = [vec![0], vec![1, 2]];
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("web.yaml", service("web", &[ups[0].port])),
            ("ing.yaml", ingress("web", "web.test", "/", "web", &[])),
        ],
        &[],
    );
    let reloads = c.reloads();
    let workers = c.worker_pids();
    assert_eq!(reloads, 1.0, "the first start counts as one");
    for round in 0..50 {
        let set = &sets[(round + 1) % 2];
        let ports: Vec<u16> = set.iter().map(|i| ups[*i].port).collect();
        c.write("web.yaml", &service("web", &ports));
        let want: BTreeSet<String> = set.iter().map(|i| ups[*i].identity.clone()).collect();
        let followed = wait_until(Duration::from_secs(10), || c.seen("web.test", "/", 6) == want);
        assert!(followed, "round {round}: traffic did not follow {want:?}\n{}", c.log());
    }
    assert_eq!(c.reloads(), reloads, "endpoint changes must not reload nginx");
    assert_eq!(c.worker_pids(), workers, "the same workers served all 50 changes");
}

#[test]
fn adding_a_host_reloads_exactly_once() {
    let (a, b) = (Upstream::start(), Upstream::start());
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            (
                "svc.yaml",
                format!("{}---\n{}", service("a", &[a.port]), service("b", &[b.port])),
            ),
            ("one.yaml", ingress("one", "one.test", "/", "a", &[])),
        ],
        &[],
    );
    let workers = c.worker_pids();
    c.write("two.yaml", &ingress("two", "two.test", "/", "b", &[]));
    assert!(
        wait_until(Duration::from_secs(10), || c.get("two.test", "/").1 == b.identity),
        "{}",
        c.log()
    );
    assert_eq!(c.reloads_reaching(2.0), 2.0, "start + one reload");
    let now = c.worker_pids();
    assert!(
        now.is_disjoint(&workers),
        "new workers after the reload: {workers:?} -> {now:?}"
    );
    assert_eq!(c.get("one.test", "/").1, a.identity);
}

#[test]
fn a_burst_of_100_ingress_edits_costs_a_handful_of_reloads() {
    let a = Upstream::start();
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("a.yaml", service("a", &[a.port])),
            ("ing.yaml", ingress("burst", "burst.test", "/", "a", &[])),
        ],
        &[],
    );
    for i in 1..=100 {
        let t = i.to_string();
        c.write(
            "ing.yaml",
            &ingress("burst", "burst.test", "/", "a", &[("proxy-read-timeout", &t)]),
        );
    }
    assert!(
        wait_until(Duration::from_secs(15), || c
            .conf()
            .contains("proxy_read_timeout 100s;")),
        "{}",
        c.log()
    );
    std::thread::sleep(Duration::from_millis(500));
    let reloads = c.reloads() - 1.0;
    assert!((1.0..=10.0).contains(&reloads), "100 edits gave {reloads} reloads");
    assert_eq!(c.get("burst.test", "/").1, a.identity);
    eprintln!("100 edits -> {reloads} reloads");
}

#[test]
fn bad_annotations_and_a_failing_nginx_test_leave_traffic_alone() {
    let a = Upstream::start();
    // A template that renders invalid nginx once a third server appears.
    let dir = tempfile::tempdir().unwrap();
    let template = custom_template(dir.path(), |base| {
        base.replacen(
            "http {",
            "http {\n{% if s.servers|length > 2 %}\n    no_such_directive on;\n{% endif %}",
            1,
        )
    });
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("a.yaml", service("a", &[a.port])),
            (
                "ing.yaml",
                ingress(
                    "one",
                    "one.test",
                    "/",
                    "a",
                    &[("proxy-read-timeout", "soon"), ("configuration-snippet", "evil on;")],
                ),
            ),
        ],
        &["--template", template.to_str().unwrap()],
    );
    assert_eq!(
        c.get("one.test", "/").1,
        a.identity,
        "a bad annotation drops only itself"
    );
    assert!(c.conf().contains("proxy_read_timeout 60s;") && !c.conf().contains("evil"));
    assert!(c.log().contains("proxy-read-timeout") && c.log().contains("snippet annotations are disabled"));

    let workers = c.worker_pids();
    c.write("two.yaml", &ingress("two", "two.test", "/", "a", &[]));
    let failed = wait_until(Duration::from_secs(10), || {
        c.metric("nginx_ingress_controller_errors") == 1.0
    });
    assert!(failed, "{}", c.log());
    assert_eq!(c.metric("nginx_ingress_controller_config_last_reload_successful"), 0.0);
    assert!(
        wait_until(Duration::from_secs(10), || c.log().contains("no_such_directive")),
        "nginx -t's error is logged\n{}",
        c.log()
    );
    // Without the new Ingress the configuration passes: it is quarantined.
    assert!(
        wait_until(Duration::from_secs(10), || c
            .metric("nginx_ingress_controller_quarantined_ingresses")
            == 1.0),
        "{}",
        c.log()
    );
    assert_eq!(c.get("one.test", "/").1, a.identity, "the running nginx is untouched");
    assert_eq!(c.worker_pids(), workers);
    // No hot loop: the same broken structure is not retried.
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(c.metric("nginx_ingress_controller_errors"), 1.0);
}

#[test]
fn a_dead_nginx_master_is_restarted_and_reconfigured() {
    let a = Upstream::start();
    let c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("a.yaml", service("a", &[a.port])),
            ("ing.yaml", ingress("one", "one.test", "/", "a", &[])),
        ],
        &[],
    );
    let master = c.nginx_master_pid().expect("nginx pid file");
    // SAFETY: the master of this test's own nginx.
    unsafe { libc::kill(master, libc::SIGKILL) };
    let restarted = wait_until(Duration::from_secs(15), || {
        c.nginx_master_pid().is_some_and(|p| p != master) && c.get("one.test", "/").1 == a.identity
    });
    assert!(restarted, "{}", c.log());
    assert_eq!(c.metric("nginx_ingress_controller_nginx_restarts_total"), 1.0);
}

#[test]
fn drives_an_external_nginx_through_its_pid_file() {
    let (a, b) = (Upstream::start(), Upstream::start());
    let pid_dir = tempfile::tempdir().unwrap();
    let pid_file = pid_dir.path().join("nginx.pid");
    let c = Controller::spawn(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            (
                "svc.yaml",
                format!("{}---\n{}", service("a", &[a.port]), service("b", &[b.port])),
            ),
            ("one.yaml", ingress("one", "one.test", "/", "a", &[])),
        ],
        &["--nginx-pid-file", pid_file.to_str().unwrap()],
    );
    let conf = c.dir.path().join("nginx/nginx.conf");
    assert!(wait_until(Duration::from_secs(10), || conf.exists()), "{}", c.log());
    assert!(
        !c.log().contains("nginx master started"),
        "external mode never starts nginx"
    );

    // The operator starts nginx on the rendered file; it daemonizes and
    // writes the pid file the controller reads.
    let (nginx, _) = tests::artifacts();
    let status = std::process::Command::new(nginx)
        .arg("-p")
        .arg(c.dir.path().join("nginx"))
        .arg("-c")
        .arg(&conf)
        .status()
        .unwrap();
    assert!(status.success());
    c.wait_ready();
    let master: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    assert_eq!(c.get("one.test", "/").1, a.identity);

    c.write("two.yaml", &ingress("two", "two.test", "/", "b", &[]));
    assert!(
        wait_until(Duration::from_secs(10), || c.get("two.test", "/").1 == b.identity),
        "{}",
        c.log()
    );
    let master_after: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    assert_eq!(master, master_after, "reloaded by signal, not restarted");

    let mut c = c;
    c.stop();
    // SAFETY: signal 0 probes the external master, which must outlive us.
    assert_eq!(
        unsafe { libc::kill(master, 0) },
        0,
        "stopping the controller leaves an external nginx running"
    );
    // SAFETY: the nginx this test started.
    unsafe { libc::kill(master, libc::SIGQUIT) };
    assert!(wait_until(Duration::from_secs(10), || unsafe { libc::kill(master, 0) } != 0));
}
