//! The main job for now: nginx with the module on 127.0.0.1, two demo
//! upstreams, and a configuration pushed through the API.

use std::fs;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::build::{workspace_root, Artifacts};

const TEMPLATE: &str = include_str!("../conf/demo.conf");

pub fn run(artifacts: &Artifacts, args: &[String]) -> Result<(), String> {
    let port: u16 = match args {
        [] => 8080,
        [flag, value] if flag == "--port" => value.parse().map_err(|_| format!("bad port {value:?}"))?,
        _ => return Err("usage: demo [--port N]".into()),
    };
    let (api, up1, up2) = (port + 2166, port + 1, port + 2);
    let prefix = workspace_root().join("build/demo");
    fs::create_dir_all(prefix.join("logs")).map_err(|e| e.to_string())?;
    let conf = TEMPLATE
        .replace("@MODULE@", &artifacts.module.display().to_string())
        .replace("@API_PORT@", &api.to_string())
        .replace("@PORT@", &port.to_string())
        .replace("@UP1@", &up1.to_string())
        .replace("@UP2@", &up2.to_string());
    fs::write(prefix.join("nginx.conf"), conf).map_err(|e| e.to_string())?;

    let (stop_tx, stop_rx) = mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = stop_tx.send(());
    })
    .map_err(|e| format!("cannot handle Ctrl-C: {e}"))?;

    let mut nginx = Command::new(&artifacts.nginx)
        .arg("-p")
        .arg(format!("{}/", prefix.display()))
        .args(["-c", "nginx.conf", "-e", "logs/error.log"])
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start nginx: {e}"))?;

    let backends = format!(
        r#"[{{"name":"demo-web-80","port":80,"endpoints":[{{"address":"127.0.0.1","port":"{up1}"}},{{"address":"127.0.0.1","port":"{up2}"}}]}}]"#
    );
    let pushed = push_when_up(&format!("http://127.0.0.1:{api}/configuration/backends"), &backends);
    if let Err(e) = pushed {
        let _ = nginx.kill();
        let _ = nginx.wait();
        return Err(format!("{e}; see {}/logs/error.log", prefix.display()));
    }

    println!(
        "nginx is serving on 127.0.0.1:{port} (pid {}), logs in {}/logs",
        nginx.id(),
        prefix.display()
    );
    println!("requests alternate between the two upstreams:");
    println!("  for i in 1 2 3 4; do curl -s http://127.0.0.1:{port}/; done");
    println!("the configuration API:");
    println!("  curl -s http://127.0.0.1:{api}/configuration/backends");
    println!("  curl -s http://127.0.0.1:{api}/configuration/status");
    println!("move all traffic to upstream B, with no reload:");
    println!(
        "  curl -s -X PUT http://127.0.0.1:{api}/configuration/backends/demo-web-80 -d '{{\"endpoints\":[{{\"address\":\"127.0.0.1\",\"port\":\"{up2}\"}}]}}'"
    );
    println!("press Ctrl-C to stop");

    loop {
        if stop_rx.recv_timeout(Duration::from_millis(200)).is_ok() {
            break;
        }
        if let Ok(Some(status)) = nginx.try_wait() {
            return Err(format!(
                "nginx exited ({status}); see {}/logs/error.log",
                prefix.display()
            ));
        }
    }
    // nginx got the terminal's SIGINT too; ask politely in case it did not.
    let _ = Command::new("kill").args(["-QUIT", &nginx.id().to_string()]).status();
    let _ = nginx.wait();
    println!("stopped");
    Ok(())
}

fn push_when_up(url: &str, body: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ureq::post(url).header("Content-Type", "application/json").send(body) {
            Ok(r) if r.status() == 201 => return Ok(()),
            Ok(r) => return Err(format!("the API answered {}", r.status())),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(format!("cannot reach the configuration API: {e}")),
        }
    }
}
