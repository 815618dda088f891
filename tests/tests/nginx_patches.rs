//! The shipped nginx carries nginx-build/patches. Each patch changes how
//! nginx works out a configuration, never which configurations it accepts;
//! these check the refusals and acceptances the patched code paths decide.

use std::process::Command;

/// `nginx -t` on an `http {}` block; nginx's messages on failure.
fn test_http(http: &str) -> Result<(), String> {
    let (nginx, _) = tests::artifacts();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let conf = dir.path().join("nginx.conf");
    let text = format!(
        "error_log {}/logs/error.log;\npid {}/logs/nginx.pid;\nevents {{}}\nhttp {{\n{http}\n}}\n",
        dir.path().display(),
        dir.path().display()
    );
    std::fs::write(&conf, text).unwrap();
    let out = Command::new(nginx)
        .arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(&conf)
        .arg("-t")
        .output()
        .unwrap();
    let messages = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(())
    } else {
        Err(messages)
    }
}

/// 0003: a server naming an address twice is refused, with listens of
/// other addresses between the two; servers sharing an address are not.
#[test]
fn a_duplicate_listen_is_refused_and_shared_addresses_are_not() {
    let twice = "server { listen 127.0.0.1:18081; listen 127.0.0.1:18082; listen 127.0.0.1:18081; }";
    let err = test_http(twice).unwrap_err();
    assert!(err.contains("a duplicate listen 127.0.0.1:18081"), "{err}");

    let mut shared = String::new();
    for i in 0..200 {
        shared.push_str(&format!(
            "server {{ server_name h{i}.test; listen 127.0.0.1:18081; listen 127.0.0.1:18082; }}\n"
        ));
    }
    test_http(&shared).unwrap();
    // The default listen a server without one gets counts too.
    test_http("server { server_name a.test; }\nserver { server_name b.test; }").unwrap();
}

/// 0001: servers with their own `quic_host_key` and servers without one
/// (which share one random key) in one configuration.
#[test]
fn servers_with_and_without_a_quic_host_key_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("quic.key");
    std::fs::write(&key, [7u8; 48]).unwrap();
    let mut http = String::new();
    for i in 0..20 {
        let own = if i % 3 == 0 {
            format!("quic_host_key {};", key.display())
        } else {
            String::new()
        };
        http.push_str(&format!(
            "server {{ server_name h{i}.test; listen 127.0.0.1:18083; {own} }}\n"
        ));
    }
    test_http(&http).unwrap();
    let missing = "server { listen 127.0.0.1:18083; quic_host_key /nonexistent/quic.key; }";
    let err = test_http(missing).unwrap_err();
    assert!(err.contains("/nonexistent/quic.key"), "{err}");
}
