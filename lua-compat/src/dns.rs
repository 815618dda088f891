//! Resolution of `ExternalName` hosts, off the write path.
//!
//! ingress-nginx's `balancer.lua` resolves every `ExternalName` once a
//! second in each worker. A lookup blocks (`getaddrinfo` has no timeout of
//! its own), so resolving inside a configuration write would let one slow or
//! hostile DNS name hold back every later write, for every tenant. Here a
//! small pool of lookup threads does the blocking; callers wait only until a
//! deadline and otherwise take the last known answer (or none yet). Answers
//! are cached by name, and a periodic refresher keeps them current.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How a name is looked up: the system resolver in production, a table in
/// tests.
pub type Lookup = Arc<dyn Fn(&str) -> std::io::Result<Vec<IpAddr>> + Send + Sync>;

/// Names unused for this long are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// The system resolver (`getaddrinfo`, so `/etc/hosts` applies), one
/// address per distinct IP in the order returned.
pub fn system_lookup() -> Lookup {
    Arc::new(|name: &str| {
        let mut out: Vec<IpAddr> = Vec::new();
        for a in (name, 0u16).to_socket_addrs()? {
            if !out.contains(&a.ip()) {
                out.push(a.ip());
            }
        }
        Ok(out)
    })
}

#[derive(Clone)]
struct Answer {
    addrs: Vec<IpAddr>,
    /// When the lookup that produced this answer finished.
    at: Instant,
    /// The lookup failed (NXDOMAIN, no network): `addrs` is empty.
    failed: bool,
}

#[derive(Default)]
struct State {
    answers: HashMap<String, Answer>,
    last_used: HashMap<String, Instant>,
    /// Names queued or being looked up.
    pending: HashSet<String>,
}

struct Shared {
    state: Mutex<State>,
    answered: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking lookup thread cannot leave the map half-written: every
        // critical section is a few map operations.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A cache of DNS answers with a pool of lookup threads.
#[derive(Clone)]
pub struct DnsCache {
    shared: Arc<Shared>,
    queue: Sender<String>,
}

/// What [`DnsCache::resolve`] could say by its deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// An answer no older than asked for.
    Fresh(Vec<IpAddr>),
    /// The deadline passed; this is the previous answer.
    Stale(Vec<IpAddr>),
    /// The deadline passed and the name was never resolved.
    Unknown,
    /// The lookup failed.
    Failed,
}

impl Resolved {
    /// The addresses to route to.
    pub fn addrs(self) -> Vec<IpAddr> {
        match self {
            Resolved::Fresh(a) | Resolved::Stale(a) => a,
            Resolved::Unknown | Resolved::Failed => Vec::new(),
        }
    }
}

impl DnsCache {
    /// Starts `threads` lookup threads; `thread_init` runs first on each
    /// (the module blocks signals and lowers the priority there).
    pub fn start(threads: usize, lookup: Lookup, thread_init: fn()) -> std::io::Result<DnsCache> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            answered: Condvar::new(),
        });
        let (queue, inbox) = mpsc::channel::<String>();
        let inbox = Arc::new(Mutex::new(inbox));
        for i in 0..threads.max(1) {
            let (shared, inbox, lookup) = (shared.clone(), inbox.clone(), lookup.clone());
            std::thread::Builder::new()
                .name(format!("dynbal-dns-{i}"))
                .spawn(move || {
                    thread_init();
                    loop {
                        let next = inbox.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        let Ok(name) = next else { return };
                        let result = lookup(&name);
                        let mut state = shared.lock();
                        state.pending.remove(&name);
                        let answer = match result {
                            Ok(addrs) => Answer {
                                addrs,
                                at: Instant::now(),
                                failed: false,
                            },
                            Err(_) => Answer {
                                addrs: Vec::new(),
                                at: Instant::now(),
                                failed: true,
                            },
                        };
                        state.answers.insert(name, answer);
                        drop(state);
                        shared.answered.notify_all();
                    }
                })?;
        }
        Ok(DnsCache { shared, queue })
    }

    /// The addresses of `name`: the cached answer if it is younger than
    /// `max_age`, else a new lookup awaited until `deadline`, else the last
    /// answer known.
    pub fn resolve(&self, name: &str, max_age: Duration, deadline: Instant) -> Resolved {
        let asked = Instant::now();
        let mut state = self.shared.lock();
        state.last_used.insert(name.to_string(), asked);
        if let Some(a) = state.answers.get(name) {
            if asked.duration_since(a.at) <= max_age {
                return if a.failed {
                    Resolved::Failed
                } else {
                    Resolved::Fresh(a.addrs.clone())
                };
            }
        }
        if state.pending.insert(name.to_string()) && self.queue.send(name.to_string()).is_err() {
            state.pending.remove(name);
        }
        loop {
            if let Some(a) = state.answers.get(name) {
                if a.at >= asked {
                    return if a.failed {
                        Resolved::Failed
                    } else {
                        Resolved::Fresh(a.addrs.clone())
                    };
                }
            }
            let now = Instant::now();
            if now >= deadline || !state.pending.contains(name) {
                return match state.answers.get(name) {
                    Some(a) if !a.failed => Resolved::Stale(a.addrs.clone()),
                    Some(_) => Resolved::Failed,
                    None => Resolved::Unknown,
                };
            }
            state = self
                .shared
                .answered
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Forgets names nobody asked about for ten minutes.
    pub fn expire(&self) {
        let now = Instant::now();
        let mut state = self.shared.lock();
        let old: Vec<String> = state
            .last_used
            .iter()
            .filter(|(_, t)| now.duration_since(**t) > FORGET_AFTER)
            .map(|(n, _)| n.clone())
            .collect();
        for name in old {
            state.last_used.remove(&name);
            state.answers.remove(&name);
        }
    }

    /// Names currently cached, for tests and status.
    pub fn len(&self) -> usize {
        self.shared.lock().answers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn table(calls: Arc<AtomicUsize>, delay: Duration) -> Lookup {
        Arc::new(move |name: &str| {
            calls.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(delay);
            match name {
                "db.example" => Ok(vec![ip("192.0.2.1")]),
                _ => Err(std::io::Error::other("NXDOMAIN")),
            }
        })
    }

    #[test]
    fn answers_are_cached_and_failures_reported() {
        let calls = Arc::new(AtomicUsize::new(0));
        let dns = DnsCache::start(2, table(calls.clone(), Duration::ZERO), || {}).unwrap();
        let soon = || Instant::now() + Duration::from_secs(5);
        let day = Duration::from_secs(86_400);
        assert_eq!(
            dns.resolve("db.example", day, soon()),
            Resolved::Fresh(vec![ip("192.0.2.1")])
        );
        assert_eq!(
            dns.resolve("db.example", day, soon()),
            Resolved::Fresh(vec![ip("192.0.2.1")])
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the second answer came from the cache");
        assert_eq!(dns.resolve("nx.example", day, soon()), Resolved::Failed);
        // max_age 0 forces a new lookup.
        assert_eq!(
            dns.resolve("db.example", Duration::ZERO, soon()),
            Resolved::Fresh(vec![ip("192.0.2.1")])
        );
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_slow_lookup_never_holds_the_caller_past_its_deadline() {
        let calls = Arc::new(AtomicUsize::new(0));
        let dns = DnsCache::start(1, table(calls, Duration::from_millis(600)), || {}).unwrap();
        let started = Instant::now();
        let r = dns.resolve("db.example", Duration::ZERO, started + Duration::from_millis(50));
        assert_eq!(r, Resolved::Unknown);
        assert!(
            started.elapsed() < Duration::from_millis(400),
            "{:?}",
            started.elapsed()
        );
        // The lookup goes on in the background and lands in the cache.
        std::thread::sleep(Duration::from_millis(800));
        let r = dns.resolve("db.example", Duration::from_secs(60), Instant::now());
        assert_eq!(r, Resolved::Fresh(vec![ip("192.0.2.1")]));
        // Past its age, a slow refresh gives the previous answer.
        let r = dns.resolve("db.example", Duration::ZERO, Instant::now() + Duration::from_millis(20));
        assert_eq!(r, Resolved::Stale(vec![ip("192.0.2.1")]));
    }

    #[test]
    fn concurrent_askers_share_one_lookup() {
        let calls = Arc::new(AtomicUsize::new(0));
        let dns = DnsCache::start(2, table(calls.clone(), Duration::from_millis(100)), || {}).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let dns = dns.clone();
                std::thread::spawn(move || {
                    dns.resolve("db.example", Duration::ZERO, Instant::now() + Duration::from_secs(5))
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), Resolved::Fresh(vec![ip("192.0.2.1")]));
        }
        assert!(calls.load(Ordering::SeqCst) <= 2, "{}", calls.load(Ordering::SeqCst));
    }
}
