//! Builds large hash rings off the event loop.
//!
//! A worker builds a backend's selector when it first routes by a new
//! version of it. For `chash` and balanced sticky sessions that means a hash
//! ring of 160 points per endpoint (times the weight): 1.6 M points for
//! 10,000 endpoints, tens of milliseconds that the request which noticed
//! the change, and every request queued behind it on that worker, would
//! wait. When the version a worker routes by has a ring of at least
//! [`OFF_LOOP_POINTS`], the new version is decoded and built here instead,
//! on one thread per worker, while the previous version keeps routing; the
//! worker cache takes the result in on the next request or timer tick.
//! Smaller backends, and a backend the worker has never routed, are built
//! inline as before.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};

use lua_compat::runtime::RuntimeBackend;
use lua_compat::selection::{Selection, Selector, Worker};

use crate::nginx::worker;

/// Backends whose current ring has this many points or more get their next
/// version built off the event loop: 1,000 endpoints of weight 1, about 2 ms
/// of work.
pub const OFF_LOOP_POINTS: usize = 160_000;

/// A finished build.
pub struct Built {
    pub name: Box<[u8]>,
    pub version: u64,
    pub backend: RuntimeBackend,
    pub selector: Selector,
}

struct Job {
    name: Box<[u8]>,
    version: u64,
    /// The backend's record, copied out of the zone.
    runtime: Vec<u8>,
    worker: Worker,
}

/// A build that failed: which backend version.
type Failed = (Box<[u8]>, u64);

struct Builder {
    jobs: Sender<Job>,
    done: Receiver<Result<Built, Failed>>,
}

thread_local! {
    static BUILDER: RefCell<Option<Builder>> = const { RefCell::new(None) };
    /// `(name, version)` of the builds in flight, in submission order.
    static PENDING: RefCell<Vec<(Box<[u8]>, u64)>> = const { RefCell::new(Vec::new()) };
    /// Recent builds that failed: those versions are built inline instead,
    /// where a bad record is logged (never resubmitted in a loop).
    static FAILED: RefCell<Vec<Failed>> = const { RefCell::new(Vec::new()) };
}

fn start() -> Option<Builder> {
    let (jobs, inbox) = mpsc::channel::<Job>();
    let (outbox, done) = mpsc::channel();
    std::thread::Builder::new()
        .name("dynbal-ring".into())
        .spawn(move || {
            worker::block_signals();
            // SAFETY: the priority change affects this thread alone.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10) };
            for Job {
                name,
                version,
                runtime,
                worker,
            } in inbox
            {
                // A record that does not decode, or a panic, costs this build
                // only: the worker then decodes it inline on its next lookup
                // and logs what is wrong.
                let built = catch_unwind(AssertUnwindSafe(|| {
                    let backend = RuntimeBackend::decode(&runtime).ok()?;
                    let selector = Selector::build(&backend, worker);
                    Some((backend, selector))
                }))
                .ok()
                .flatten()
                .map(|(backend, selector)| Built {
                    name: name.clone(),
                    version,
                    backend,
                    selector,
                })
                .ok_or((name, version));
                if outbox.send(built).is_err() {
                    break;
                }
            }
        })
        .ok()?;
    Some(Builder { jobs, done })
}

/// Whether a build of `name` at `version` is in flight.
pub fn is_pending(name: &[u8], version: u64) -> bool {
    PENDING.with_borrow(|p| p.iter().any(|(n, v)| *v == version && **n == *name))
}

/// How many builds are in flight: `PENDING`'s length, mirrored in a plain
/// static because every lookup asks, and a thread-local read from a shared
/// object costs a `__tls_get_addr` call. Only the event loop changes it.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Whether any build is in flight (checked on every lookup).
pub fn any_pending() -> bool {
    IN_FLIGHT.load(Ordering::Relaxed) != 0
}

/// Queues the decoding of record `runtime` and the build of its selector.
/// Gives the record back if the thread cannot be started, for the caller to
/// build inline.
pub fn submit(name: &[u8], version: u64, runtime: Vec<u8>, worker: Worker) -> Result<(), Vec<u8>> {
    if FAILED.with_borrow(|f| f.iter().any(|(n, v)| *v == version && **n == *name)) {
        return Err(runtime);
    }
    BUILDER.with_borrow_mut(|b| {
        if b.is_none() {
            *b = start();
        }
        let Some(builder) = b.as_ref() else {
            return Err(runtime);
        };
        let job = Job {
            name: name.into(),
            version,
            runtime,
            worker,
        };
        match builder.jobs.send(job) {
            Ok(()) => {
                PENDING.with_borrow_mut(|p| {
                    p.push((name.into(), version));
                    IN_FLIGHT.store(p.len(), Ordering::Relaxed);
                });
                Ok(())
            }
            Err(mpsc::SendError(job)) => {
                *b = None;
                Err(job.runtime)
            }
        }
    })
}

/// The builds that finished since the last call.
pub fn take_finished() -> Vec<Built> {
    BUILDER.with_borrow(|b| {
        let Some(builder) = b.as_ref() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while let Ok(result) = builder.done.try_recv() {
            // Results come back in submission order.
            PENDING.with_borrow_mut(|p| {
                if !p.is_empty() {
                    p.remove(0);
                }
                IN_FLIGHT.store(p.len(), Ordering::Relaxed);
            });
            match result {
                Ok(built) => out.push(built),
                Err(failed) => FAILED.with_borrow_mut(|f| {
                    if f.len() >= 16 {
                        f.remove(0);
                    }
                    f.push(failed);
                }),
            }
        }
        out
    })
}
