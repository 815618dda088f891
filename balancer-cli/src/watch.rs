//! `watch`: from successive `/configuration/status` answers to events: the
//! generation moved, a worker caught up with it, all did, a worker came or
//! went. The tracker is pure (times are given to it), so the event logic is
//! tested without a server; `commands::watch` only polls and prints.
//!
//! Catch-up is timed from the poll that first saw the new generation, so
//! a time is exact to within the polling period. While a worker is behind,
//! the loop polls every [`CATCH_UP_POLL`] rather than every `--interval`:
//! idle workers catch up within about 100 ms, which a 1 s period would not
//! show.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;

use crate::bodies::Status;

/// The polling period while some worker is behind.
pub const CATCH_UP_POLL: Duration = Duration::from_millis(20);

/// Something `watch` prints.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The first answer.
    Start {
        generation: u64,
        workers: Vec<WorkerAt>,
    },
    /// The generation moved (by `writes`; several writes between two polls
    /// are seen as one move). `behind`: workers not at it yet.
    Generation {
        generation: u64,
        previous: u64,
        writes: u64,
        workers: usize,
        behind: Vec<i64>,
    },
    /// The generation went down: a new zone (nginx restarted, or reloaded
    /// with another zone size).
    Reset {
        generation: u64,
        previous: u64,
    },
    CaughtUp {
        pid: i64,
        generation: u64,
        after_ms: u64,
    },
    AllCaughtUp {
        generation: u64,
        workers: usize,
        after_ms: u64,
    },
    WorkerStarted {
        pid: i64,
        generation: u64,
    },
    WorkerExited {
        pid: i64,
    },
}

/// A worker and the generation it has applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerAt {
    pub pid: i64,
    pub generation: u64,
}

/// The state between polls.
#[derive(Debug, Default)]
pub struct Tracker {
    generation: Option<u64>,
    /// When the current generation was first seen.
    changed_at: Duration,
    workers: BTreeMap<i64, u64>,
    /// Workers not yet at the current generation, reported as they arrive.
    behind: BTreeSet<i64>,
    /// Generation moves seen so far (a reset counts as one).
    pub writes: u64,
}

impl Tracker {
    /// Workers not at the latest generation yet.
    pub fn behind(&self) -> &BTreeSet<i64> {
        &self.behind
    }

    /// Folds in one answer, received `now` after the watch started.
    pub fn observe(&mut self, s: &Status, now: Duration) -> Vec<Event> {
        let mut events = Vec::new();
        let current: BTreeMap<i64, u64> = s.workers.iter().map(|w| (w.pid, w.generation)).collect();
        let after_ms = |at: Duration| u64::try_from(now.saturating_sub(at).as_millis()).unwrap_or(u64::MAX);
        let Some(previous) = self.generation else {
            self.generation = Some(s.generation);
            self.changed_at = now;
            self.behind = lagging(&current, s.generation);
            self.workers = current;
            events.push(Event::Start {
                generation: s.generation,
                workers: self
                    .workers
                    .iter()
                    .map(|(pid, generation)| WorkerAt {
                        pid: *pid,
                        generation: *generation,
                    })
                    .collect(),
            });
            return events;
        };
        for (pid, generation) in &current {
            if !self.workers.contains_key(pid) {
                events.push(Event::WorkerStarted {
                    pid: *pid,
                    generation: *generation,
                });
            }
        }
        for pid in self.workers.keys().filter(|p| !current.contains_key(p)) {
            events.push(Event::WorkerExited { pid: *pid });
        }
        self.behind.retain(|p| current.contains_key(p));
        if s.generation != previous {
            self.generation = Some(s.generation);
            self.changed_at = now;
            if s.generation < previous {
                self.writes += 1;
                events.push(Event::Reset {
                    generation: s.generation,
                    previous,
                });
            } else {
                self.writes += s.generation - previous;
            }
            self.behind = lagging(&current, s.generation);
            if s.generation > previous {
                events.push(Event::Generation {
                    generation: s.generation,
                    previous,
                    writes: s.generation - previous,
                    workers: current.len(),
                    behind: self.behind.iter().copied().collect(),
                });
            }
        } else if !self.behind.is_empty() {
            let caught: Vec<i64> = self
                .behind
                .iter()
                .copied()
                .filter(|p| current.get(p).is_some_and(|g| *g >= s.generation))
                .collect();
            for pid in caught {
                self.behind.remove(&pid);
                events.push(Event::CaughtUp {
                    pid,
                    generation: s.generation,
                    after_ms: after_ms(self.changed_at),
                });
            }
            if self.behind.is_empty() {
                events.push(Event::AllCaughtUp {
                    generation: s.generation,
                    workers: current.len(),
                    after_ms: after_ms(self.changed_at),
                });
            }
        }
        // A worker that started behind the generation is waited for too.
        for (pid, generation) in &current {
            if !self.workers.contains_key(pid) && *generation < s.generation {
                self.behind.insert(*pid);
            }
        }
        self.workers = current;
        events
    }
}

fn lagging(workers: &BTreeMap<i64, u64>, generation: u64) -> BTreeSet<i64> {
    workers
        .iter()
        .filter(|(_, g)| **g < generation)
        .map(|(p, _)| *p)
        .collect()
}

/// One event as a line of text, prefixed by the time since the watch began.
pub fn line(at: Duration, e: &Event) -> String {
    let text = match e {
        Event::Start { generation, workers } => {
            let list: Vec<String> = workers
                .iter()
                .map(|w| format!("{} at {}", w.pid, w.generation))
                .collect();
            format!(
                "generation {generation}; {} workers: {}",
                workers.len(),
                if list.is_empty() {
                    "none".into()
                } else {
                    list.join(", ")
                }
            )
        }
        Event::Generation {
            generation,
            previous,
            writes,
            workers,
            behind,
        } => {
            let moved = if *writes == 1 {
                format!("generation {generation} (was {previous})")
            } else {
                format!("generation {generation} (was {previous}, {writes} writes)")
            };
            if behind.is_empty() {
                format!("{moved}: all {workers} workers at it")
            } else {
                let pids: Vec<String> = behind.iter().map(i64::to_string).collect();
                format!(
                    "{moved}: {} of {workers} workers at it, waiting for {}",
                    workers - behind.len(),
                    pids.join(", ")
                )
            }
        }
        Event::Reset { generation, previous } => {
            format!("generation {generation} (was {previous}): a new zone; nginx restarted or its zone size changed")
        }
        Event::CaughtUp {
            pid,
            generation,
            after_ms,
        } => format!("worker {pid} at generation {generation} (+{after_ms}ms)"),
        Event::AllCaughtUp {
            generation,
            workers,
            after_ms,
        } => format!("all {workers} workers at generation {generation} (+{after_ms}ms)"),
        Event::WorkerStarted { pid, generation } => format!("worker {pid} started, at generation {generation}"),
        Event::WorkerExited { pid } => format!("worker {pid} exited"),
    };
    format!("[{:>8.3}s] {text}", at.as_secs_f64())
}

/// One event as a JSON line (`--output json`): the event's fields plus
/// `at_ms`, the time since the watch began.
pub fn json_line(at: Duration, e: &Event) -> String {
    let mut v = serde_json::to_value(e).expect("events serialize");
    if let Some(obj) = v.as_object_mut() {
        obj.insert("at_ms".into(), (at.as_millis() as u64).into());
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bodies::Worker;

    fn status(generation: u64, workers: &[(i64, u64)]) -> Status {
        Status {
            generation,
            workers: workers
                .iter()
                .map(|(pid, generation)| Worker {
                    pid: *pid,
                    generation: *generation,
                })
                .collect(),
            ..Status::default()
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_write_then_each_worker_catching_up() {
        let mut t = Tracker::default();
        let e = t.observe(&status(3, &[(1, 3), (2, 3)]), ms(0));
        assert_eq!(
            e,
            [Event::Start {
                generation: 3,
                workers: vec![WorkerAt { pid: 1, generation: 3 }, WorkerAt { pid: 2, generation: 3 }]
            }]
        );
        assert_eq!(t.observe(&status(3, &[(1, 3), (2, 3)]), ms(1000)), []);
        let e = t.observe(&status(4, &[(1, 4), (2, 3)]), ms(2000));
        assert_eq!(
            e,
            [Event::Generation {
                generation: 4,
                previous: 3,
                writes: 1,
                workers: 2,
                behind: vec![2]
            }]
        );
        assert_eq!(t.behind().len(), 1);
        assert_eq!(t.observe(&status(4, &[(1, 4), (2, 3)]), ms(2020)), []);
        let e = t.observe(&status(4, &[(1, 4), (2, 4)]), ms(2060));
        assert_eq!(
            e,
            [
                Event::CaughtUp {
                    pid: 2,
                    generation: 4,
                    after_ms: 60
                },
                Event::AllCaughtUp {
                    generation: 4,
                    workers: 2,
                    after_ms: 60
                }
            ]
        );
        assert!(t.behind().is_empty());
        // Two writes between polls, every worker already there.
        let e = t.observe(&status(6, &[(1, 6), (2, 6)]), ms(3000));
        assert_eq!(
            e,
            [Event::Generation {
                generation: 6,
                previous: 4,
                writes: 2,
                workers: 2,
                behind: vec![]
            }]
        );
        assert_eq!(t.writes, 3);
        assert_eq!(
            line(ms(3000), &e[0]),
            "[   3.000s] generation 6 (was 4, 2 writes): all 2 workers at it"
        );
    }

    #[test]
    fn workers_come_and_go_and_zones_reset() {
        let mut t = Tracker::default();
        t.observe(&status(5, &[(1, 5)]), ms(0));
        // A reload: a new worker, the old one gone, the new one behind.
        let e = t.observe(&status(5, &[(7, 4)]), ms(100));
        assert_eq!(
            e,
            [
                Event::WorkerStarted { pid: 7, generation: 4 },
                Event::WorkerExited { pid: 1 }
            ]
        );
        assert_eq!(t.behind().iter().copied().collect::<Vec<_>>(), [7]);
        let e = t.observe(&status(5, &[(7, 5)]), ms(150));
        assert!(matches!(e[0], Event::CaughtUp { pid: 7, .. }), "{e:?}");
        let e = t.observe(&status(1, &[(9, 1)]), ms(200));
        assert_eq!(
            e[2],
            Event::Reset {
                generation: 1,
                previous: 5
            }
        );
        assert_eq!(t.writes, 1);
        assert!(line(ms(200), &e[2]).contains("a new zone"));
    }

    #[test]
    fn lines_and_json_lines() {
        let e = Event::Generation {
            generation: 4,
            previous: 3,
            writes: 1,
            workers: 3,
            behind: vec![12, 13],
        };
        assert_eq!(
            line(ms(1234), &e),
            "[   1.234s] generation 4 (was 3): 1 of 3 workers at it, waiting for 12, 13"
        );
        let v: serde_json::Value = serde_json::from_str(&json_line(ms(1234), &e)).unwrap();
        assert_eq!(v["event"], "generation");
        assert_eq!(v["at_ms"], 1234);
        assert_eq!(v["behind"], serde_json::json!([12, 13]));
        let start = Event::Start {
            generation: 0,
            workers: vec![],
        };
        assert_eq!(line(ms(0), &start), "[   0.000s] generation 0; 0 workers: none");
        let start = Event::Start {
            generation: 2,
            workers: vec![WorkerAt { pid: 9, generation: 1 }],
        };
        assert_eq!(line(ms(0), &start), "[   0.000s] generation 2; 1 workers: 9 at 1");
        let v: serde_json::Value = serde_json::from_str(&json_line(ms(0), &start)).unwrap();
        assert_eq!(v["workers"], serde_json::json!([{"pid": 9, "generation": 1}]));
        assert_eq!(
            line(
                ms(50),
                &Event::CaughtUp {
                    pid: 5,
                    generation: 2,
                    after_ms: 48
                }
            ),
            "[   0.050s] worker 5 at generation 2 (+48ms)"
        );
    }
}
