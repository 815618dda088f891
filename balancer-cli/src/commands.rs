//! One function per subcommand: the request, then the answer as a table
//! or as the API's JSON. Everything that can be pure lives in `render`,
//! `watch`, `endpoint_arg` and `http`; these only wire them to the client.

use std::io::{ErrorKind, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use lua_compat::wire::{Backend, UpstreamHashByConfig};

use crate::bodies::{self, Health, Status, Written};
use crate::cli::{Output, PutArgs};
use crate::client::{backend_path, Client};
use crate::failure::Failure;
use crate::http::Response;
use crate::pretty;
use crate::render;
use crate::transport::TransportError;
use crate::watch::{self, Tracker, CATCH_UP_POLL};

const BACKENDS: &str = "/configuration/backends";
const STATUS: &str = "/configuration/status";
const HEALTH: &str = "/configuration/health";

/// How long `watch --count` waits for workers after the last write.
const CATCH_UP_WAIT: Duration = Duration::from_secs(10);

pub fn get(client: &Client, output: Output, name: Option<&str>) -> Result<(), Failure> {
    let path = name.map_or(BACKENDS.to_string(), backend_path);
    let r = client.call("GET", &path, None)?;
    if output == Output::Json {
        return print_json(&r);
    }
    match name {
        None => print(&render::backends(&answer::<Vec<Backend>>("GET", &path, &r)?)),
        Some(_) => print(&render::backend(&answer::<Backend>("GET", &path, &r)?)),
    }
}

pub fn put(client: &Client, output: Output, args: &PutArgs) -> Result<(), Failure> {
    let body = match &args.file {
        Some(file) => read_input(file)?,
        None => {
            let backend = Backend {
                name: args.name.clone(),
                endpoints: args.endpoints.clone(),
                load_balance: args.algorithm.map(|a| a.wire_name().to_string()).unwrap_or_default(),
                upstream_hash_by: UpstreamHashByConfig {
                    hash_by: args.hash_by.clone().unwrap_or_default(),
                    ..UpstreamHashByConfig::default()
                },
                max_fails: args.max_fails,
                fail_timeout: args.fail_timeout,
                ..Backend::default()
            };
            // The module's own check, so a bad flag is reported before
            // anything is sent (the API would refuse the same with 400).
            lua_compat::validate_backend(&backend)
                .map_err(|e| Failure::Usage(format!("the backend these flags describe is invalid: {e}")))?;
            serde_json::to_vec(&backend).expect("a backend serializes")
        }
    };
    let path = backend_path(&args.name);
    let r = client.call("PUT", &path, Some(&body))?;
    if output == Output::Json {
        return print_json(&r);
    }
    let written: Written = answer("PUT", &path, &r)?;
    let what = if r.status == 201 { "created" } else { "replaced" };
    print(&format!(
        "backend {:?} {what}, generation {}\n",
        args.name, written.generation
    ))
}

pub fn delete(client: &Client, output: Output, name: &str) -> Result<(), Failure> {
    let r = client.call("DELETE", &backend_path(name), None)?;
    match output {
        Output::Json => print_json(&r),
        Output::Table => print(&format!("backend {name:?} deleted\n")),
    }
}

pub fn status(client: &Client, output: Output) -> Result<(), Failure> {
    let r = client.call("GET", STATUS, None)?;
    match output {
        Output::Json => print_json(&r),
        Output::Table => print(&render::status(&answer::<Status>("GET", STATUS, &r)?)),
    }
}

pub fn health(client: &Client, output: Output) -> Result<(), Failure> {
    let r = client.call("GET", HEALTH, None)?;
    match output {
        Output::Json => print_json(&r),
        Output::Table => print(&render::health(&answer::<Health>("GET", HEALTH, &r)?)),
    }
}

pub fn apply(client: &Client, output: Output, file: &Path) -> Result<(), Failure> {
    let body = read_input(file)?;
    let r = client.call("POST", BACKENDS, Some(&body))?;
    if output == Output::Json {
        return print_json(&r);
    }
    let written: Written = answer("POST", BACKENDS, &r)?;
    // The API accepted the body, so it is a JSON array.
    let n = serde_json::from_slice::<Vec<serde::de::IgnoredAny>>(&body).map_or(0, |v| v.len());
    print(&format!(
        "applied {n} backends (all others removed), generation {}\n",
        written.generation
    ))
}

pub fn watch(client: &Client, output: Output, interval: Duration, count: Option<u64>) -> Result<(), Failure> {
    let start = Instant::now();
    let mut tracker = Tracker::default();
    let mut counted_at: Option<Instant> = None;
    loop {
        let r = client.call("GET", STATUS, None)?;
        let s: Status = answer("GET", STATUS, &r)?;
        let now = start.elapsed();
        for event in tracker.observe(&s, now) {
            print(&match output {
                Output::Table => watch::line(now, &event),
                Output::Json => watch::json_line(now, &event),
            })?;
            print("\n")?;
        }
        if count.is_some_and(|n| tracker.writes >= n) {
            if tracker.behind().is_empty() {
                return Ok(());
            }
            let since = *counted_at.get_or_insert_with(Instant::now);
            if since.elapsed() >= CATCH_UP_WAIT {
                let pids: Vec<String> = tracker.behind().iter().map(i64::to_string).collect();
                return Err(Failure::Behind(format!(
                    "workers {} not at generation {} after {CATCH_UP_WAIT:?}",
                    pids.join(", "),
                    s.generation
                )));
            }
        }
        let pause = if tracker.behind().is_empty() {
            interval
        } else {
            interval.min(CATCH_UP_POLL)
        };
        std::thread::sleep(pause);
    }
}

/// An answer's JSON as `T`; one that is not is no usable answer (exit 3),
/// like one that is not HTTP.
fn answer<T: serde::de::DeserializeOwned>(method: &str, path: &str, r: &Response) -> Result<T, Failure> {
    bodies::read(&format!("{method} {path}"), &r.body).map_err(|e| Failure::Transport {
        method: method.into(),
        path: path.into(),
        error: TransportError::Broken(e),
    })
}

/// A file's bytes, or stdin's for `-`.
fn read_input(file: &Path) -> Result<Vec<u8>, Failure> {
    let mut data = Vec::new();
    let result = if file == Path::new("-") {
        std::io::stdin().read_to_end(&mut data).map(|_| ())
    } else {
        std::fs::read(file).map(|d| data = d)
    };
    result.map_err(|e| Failure::Usage(format!("cannot read {}: {e}", file.display())))?;
    Ok(data)
}

fn print_json(r: &Response) -> Result<(), Failure> {
    if r.body.is_empty() {
        return Ok(());
    }
    print(&pretty::indent(&r.body))?;
    print("\n")
}

/// Writes to stdout. A reader that went away (`| head`) ends the command
/// quietly, as it does for other tools.
fn print(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(Failure::Usage(format!("writing to stdout: {e}"))),
    }
}
