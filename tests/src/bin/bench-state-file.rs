//! The state file (`dynamic_balancer_state`): what it costs a write and
//! what it buys a restart.
//!
//! `post`: two fronts side by side, one worker each, one with the state
//! file and one without, get the same POST of 1,000 backends × 10
//! endpoints (ingress-nginx's full shape), alternating which goes first.
//! Per front: the POST's latency and the time from its return until a
//! backend only the new set has is routable. With the file: the time from
//! the POST's return until the file holds the new generation, and the
//! write's own duration as the module logs it.
//!
//! `restore`: the front with the file is killed (SIGKILL to the master and
//! its worker) and started again; the time from the start to the first
//! routed request, against the same restart of the front without a file
//! (whose first answer is a 503), and the restore's duration from the log.
//!
//! `cargo run --release -p tests --bin bench-state-file [-- ROUNDS]` (default 10; even, so each front goes
//! first as often)

use std::io::Read;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::bench::{ingress_backend, median, upstream_pair, Front, Proc};
use tests::process::{wait_listening, wait_released};
use tests::state_dir::StateDir;

const BACKENDS: usize = 1000;
const ENDPOINTS: usize = 10;
/// Any single wait of the benchmark.
const PATIENCE: Duration = Duration::from_secs(30);

/// A full set whose every fake endpoint depends on `variant`, so every
/// blob changes; `last` exists only in this set and routes to `real`.
fn backend_set(variant: usize, real: &[Value], last: &str) -> String {
    let mut list: Vec<Value> = (0..BACKENDS - 1)
        .map(|i| {
            let eps = (0..ENDPOINTS)
                .map(|j| json!({"address": format!("10.{}.{}.{}", i / 250, i % 250, j + 1), "port": (8000 + variant).to_string()}))
                .collect();
            ingress_backend(&format!("default-svc-{i:04}-80"), eps)
        })
        .collect();
    list.push(ingress_backend(last, real.to_vec()));
    Value::Array(list).to_string()
}

struct Nginx {
    proc: Proc,
    port: u16,
    api_port: u16,
    state: Option<StateDir>,
}

impl Nginx {
    fn start(state: Option<StateDir>) -> Nginx {
        let directive = state
            .as_ref()
            .map(|s| format!(" {}", s.directive()))
            .unwrap_or_default();
        let front = Front {
            extra: &directive,
            ..Front::default()
        };
        let proc = Proc::start(&front.conf());
        let nginx = Nginx {
            proc,
            port: front.port,
            api_port: front.api_port,
            state,
        };
        wait_listening(nginx.api_port, PATIENCE);
        nginx
    }

    /// POSTs `body`; returns the generation and how long the POST took.
    fn post(&self, agent: &ureq::Agent, body: &str) -> (u64, Duration) {
        let started = Instant::now();
        let mut r = agent
            .post(&format!("http://127.0.0.1:{}/configuration/backends", self.api_port))
            .header("Content-Type", "application/json")
            .send(body)
            .expect("POST");
        let took = started.elapsed();
        assert_eq!(r.status().as_u16(), 201, "POST refused");
        let answer: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        (answer["generation"].as_u64().unwrap(), took)
    }

    /// Polls until `backend` routes (200); the first answer's status too.
    fn until_routable(&self, agent: &ureq::Agent, backend: &str) -> (Duration, u16) {
        let started = Instant::now();
        let url = format!("http://127.0.0.1:{}/", self.port);
        let mut first = None;
        loop {
            let status = agent
                .get(&url)
                .header("X-Backend", backend)
                .call()
                .map(|r| r.status().as_u16());
            if let Ok(s) = status {
                first.get_or_insert(s);
                if s == 200 {
                    return (started.elapsed(), first.unwrap());
                }
            }
            assert!(started.elapsed() < PATIENCE, "{backend} never routed");
        }
    }

    /// Watches the state file's directory with inotify from a thread that
    /// sleeps until a rename lands there (so it takes no CPU from what is
    /// measured): the moment the file named `generation` was renamed into
    /// place.
    fn watch_file(&self, generation: u64) -> std::thread::JoinHandle<Instant> {
        let state = self.state.as_ref().expect("a front with a state file");
        let (dir, path) = (state.dir.clone(), state.path.clone());
        let want = format!("{{\"version\":1,\"generation\":{generation},");
        // SAFETY: plain inotify calls on a descriptor this function owns
        // until the thread closes it.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1");
        let c_dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a live inotify descriptor and a NUL-terminated path.
        assert!(unsafe { libc::inotify_add_watch(fd, c_dir.as_ptr(), libc::IN_MOVED_TO) } >= 0);
        std::thread::spawn(move || {
            let mut events = [0u8; 4096];
            let mut head = vec![0u8; want.len()];
            let deadline = Instant::now() + PATIENCE;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: poll on one pollfd we own, for at most `left`.
                let ready = unsafe { libc::poll(&mut pfd, 1, left.as_millis() as libc::c_int) };
                assert!(ready > 0, "the file never reached generation {generation}");
                // SAFETY: reads into a buffer we own, from our descriptor,
                // which poll found readable.
                let n = unsafe { libc::read(fd, events.as_mut_ptr().cast(), events.len()) };
                let at = Instant::now();
                assert!(n > 0, "inotify read");
                let mut f = std::fs::File::open(&path).unwrap();
                if f.read_exact(&mut head).is_ok() && head == want.as_bytes() {
                    // SAFETY: closing the descriptor this thread owns.
                    unsafe { libc::close(fd) };
                    return at;
                }
            }
        })
    }

    /// A number the module logged: in the last line containing `marker`,
    /// the figure before ` ms`.
    fn logged_ms(&self, marker: &str) -> Option<f64> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let log = self.proc.error_log();
            if let Some(line) = log.lines().rev().find(|l| l.contains(marker)) {
                let before = line.rsplit_once(" ms")?.0;
                return before.rsplit(' ').next()?.parse().ok();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL to everything, then a fresh start on the same
    /// configuration; how long until `backend` first answers, and with
    /// which status.
    fn crash_and_restart(&mut self, agent: &ureq::Agent, backend: &str) -> (Duration, u16) {
        self.proc.kill_all();
        wait_released(&[self.port, self.api_port], PATIENCE);
        let started = Instant::now();
        self.proc.respawn();
        wait_listening(self.port, PATIENCE);
        let url = format!("http://127.0.0.1:{}/", self.port);
        loop {
            if let Ok(r) = agent.get(&url).header("X-Backend", backend).call() {
                return (started.elapsed(), r.status().as_u16());
            }
            assert!(started.elapsed() < PATIENCE, "nginx did not come back");
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10);
    let (_upstreams, a, b) = upstream_pair();
    let real = [
        json!({"address": "127.0.0.1", "port": a.to_string()}),
        json!({"address": "127.0.0.1", "port": b.to_string()}),
    ];
    let mut on = Nginx::start(Some(StateDir::new()));
    let mut off = Nginx::start(None);
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let first = backend_set(0, &real, "last-0");
    println!(
        "payload: {BACKENDS} backends x {ENDPOINTS} endpoints, {:.2} MB",
        first.len() as f64 / 1e6
    );
    let watch = on.watch_file(1);
    for nginx in [&on, &off] {
        nginx.post(&agent, &first);
    }
    watch.join().unwrap();

    println!("round  front  POST ms  routable after POST ms  file renamed after POST ms  write ms (log)");
    // [front: none, file][position in the round: first, second]
    let mut posts: [[Vec<f64>; 2]; 2] = Default::default();
    let mut routables: [[Vec<f64>; 2]; 2] = Default::default();
    let (mut file_after, mut write_logged) = (vec![], vec![]);
    for round in 1..=rounds {
        let last = format!("last-{round}");
        let body = backend_set(round, &real, &last);
        let order = if round % 2 == 0 { [true, false] } else { [false, true] };
        for (position, with_file) in order.into_iter().enumerate() {
            let nginx = if with_file { &on } else { &off };
            // Each POST starts from a quiet machine: the other front's
            // write, its timers and log lines are done.
            std::thread::sleep(Duration::from_millis(300));
            // Generations go up by one per POST on each front.
            let watch = with_file.then(|| nginx.watch_file(round as u64 + 1));
            let (generation, post_took) = nginx.post(&agent, &body);
            let returned = Instant::now();
            let (routable, _) = nginx.until_routable(&agent, &last);
            let (file, logged) = if let Some(watch) = watch {
                assert_eq!(generation, round as u64 + 1);
                // Negative when the file was in place before the answer arrived.
                let renamed = watch.join().unwrap();
                let file = match renamed.checked_duration_since(returned) {
                    Some(after) => ms(after),
                    None => -ms(returned - renamed),
                };
                let logged = nginx.logged_ms(&format!("written: generation {generation},"));
                (Some(file), logged)
            } else {
                (None, None)
            };
            println!(
                "{round:>5}  {:>5}  {:>7.1}  {:>22.2}  {:>26}  {:>14}",
                if with_file { "file" } else { "none" },
                ms(post_took),
                ms(routable),
                file.map_or("-".into(), |f| format!("{f:.2}")),
                logged.map_or("-".into(), |l| format!("{l:.2}")),
            );
            posts[usize::from(with_file)][position].push(ms(post_took));
            routables[usize::from(with_file)][position].push(ms(routable));
            file_after.extend(file);
            write_logged.extend(logged);
        }
    }
    let file_bytes = std::fs::metadata(&on.state.as_ref().unwrap().path).map_or(0, |m| m.len());
    // The front that goes first in a round answers its first request
    // slower, file or not (its previous POST was more recent), so each
    // position is compared with itself.
    for (what, figures) in [("POST", &posts), ("routable after POST", &routables)] {
        let mut ratios = Vec::new();
        for (position, name) in ["first", "second"].into_iter().enumerate() {
            let (file, none) = (
                median(figures[1][position].clone()),
                median(figures[0][position].clone()),
            );
            ratios.push(file / none);
            println!(
                "median {what}, front going {name}: file {file:.2} ms, none {none:.2} ms (ratio {:.3})",
                file / none
            );
        }
        let all = |f: usize| median(figures[f].concat());
        println!(
            "median {what}, all: file {:.2} ms, none {:.2} ms; ratio by position (geometric mean) {:.3}",
            all(1),
            all(0),
            (ratios[0] * ratios[1]).sqrt()
        );
    }
    println!(
        "state file {:.2} MB: renamed into place {:.1} ms (median, inotify) after the POST returned; the whole write (render, write, fsync, rename, fsync of the directory) {:.1} ms (median of the module's log)",
        file_bytes as f64 / 1e6,
        median(file_after),
        median(write_logged),
    );

    // A crash and a start: the front with the file routes at once.
    let last = format!("last-{rounds}");
    let (mut restore_on, mut restore_off, mut restore_logged) = (vec![], vec![], vec![]);
    println!("restart  file: first answer ms (status)  restore ms (log)  none: first answer ms (status)");
    for round in 1..=rounds.min(9) {
        let (t_on, s_on) = on.crash_and_restart(&agent, &last);
        assert_eq!(s_on, 200, "the first request after a restart must route");
        let logged = on.logged_ms("from the state file");
        let (t_off, s_off) = off.crash_and_restart(&agent, &last);
        println!(
            "{round:>7}  {:>28.1} ({s_on})  {:>16}  {:>25.1} ({s_off})",
            ms(t_on),
            logged.map_or("-".into(), |l| format!("{l:.1}")),
            ms(t_off)
        );
        restore_on.push(ms(t_on));
        restore_off.push(ms(t_off));
        restore_logged.extend(logged);
    }
    println!(
        "median first answer after a start: with the file {:.1} ms (routed), without {:.1} ms (503); restore {:.1} ms (log)",
        median(restore_on),
        median(restore_off),
        median(restore_logged)
    );
}
