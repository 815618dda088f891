//! `mirror-target` on real nginx: each request is also sent to a shadow
//! upstream, whose answer is ignored; a shadow on the module's API port is
//! refused (the request is served, not mirrored).

use std::time::Duration;

use tests::controller::{ingress, service, wait_until, Controller, INGRESS_CLASS};
use tests::Upstream;

#[test]
fn requests_are_copied_to_the_mirror_and_answered_by_the_backend() {
    let up = Upstream::start();
    let shadow = Upstream::start();
    let target = format!("http://127.0.0.1:{}$request_uri", shadow.port);
    let mirrored = [("mirror-target", target.as_str()), ("mirror-host", "shadow.test")];
    let mut c = Controller::start(
        &[
            ("class.yaml", INGRESS_CLASS.into()),
            ("svc.yaml", service("web", &[up.port])),
            ("app.yaml", ingress("app", "app.test", "/", "web", &mirrored)),
            ("plain.yaml", ingress("plain", "plain.test", "/", "web", &[])),
        ],
        &[],
    );
    let (status, body) = c.get("app.test", "/orders?id=7");
    assert_eq!((status, body.as_str()), (200, up.identity.as_str()), "{}", c.log());
    assert!(
        wait_until(Duration::from_secs(5), || shadow.hits() == 1),
        "the mirror got {} requests",
        shadow.hits()
    );
    assert_eq!(c.get("plain.test", "/").0, 200);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(shadow.hits(), 1, "only the mirrored Ingress is copied");
    assert_eq!(up.hits(), 2);
    c.stop();
}
