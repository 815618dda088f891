//! ingress-nginx's `nginx_process_*` family: CPU, I/O and memory of the
//! nginx master and its children (workers, cache manager and loader),
//! read from `/proc` at each scrape.
//!
//! The counters only go up although processes come and go (a reload
//! replaces every worker): each process's growth since the last scrape is
//! added, so an exited worker's time stays counted up to the scrape before
//! it left, as process-exporter (which ingress-nginx uses) counts a group.
//!
//! Two deliberate differences from ingress-nginx, whose matcher takes every
//! process in the container (its own controller included) and counts only
//! system CPU time: here the group is nginx alone and `cpu_seconds_total`
//! is user plus system time, what the dashboards' "Average CPU" means.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Gauge, IntCounter, IntGauge, Opts};

/// One process's readings at one scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reading {
    /// `(pid, start time in ticks)`: a pid reused by a new process is a
    /// new process.
    pub id: (i32, u64),
    pub cpu_ticks: u64,
    /// `None` when `/proc/<pid>/io` cannot be read (another user's process
    /// without CAP_SYS_PTRACE).
    pub read_bytes: Option<u64>,
    pub write_bytes: Option<u64>,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub start_ticks: u64,
}

/// The growth of the group's counters between two scrapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Growth {
    pub cpu_ticks: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

/// What each live process had at the last scrape.
#[derive(Debug, Default)]
pub struct Accumulator {
    last: HashMap<(i32, u64), Reading>,
}

impl Accumulator {
    /// What grew since the last call: a process seen before adds its
    /// difference, a new one all it has. Processes gone are forgotten.
    pub fn advance(&mut self, now: &[Reading]) -> Growth {
        let mut g = Growth::default();
        let mut next = HashMap::with_capacity(now.len());
        for r in now {
            let before = self.last.get(&r.id).copied().unwrap_or(Reading {
                id: r.id,
                ..Reading::default()
            });
            g.cpu_ticks += r.cpu_ticks.saturating_sub(before.cpu_ticks);
            g.read_bytes += r.read_bytes.unwrap_or(0).saturating_sub(before.read_bytes.unwrap_or(0));
            g.write_bytes += r
                .write_bytes
                .unwrap_or(0)
                .saturating_sub(before.write_bytes.unwrap_or(0));
            next.insert(r.id, *r);
        }
        self.last = next;
        g
    }
}

/// The family, as a collector that reads `/proc` when gathered.
#[derive(Clone)]
pub struct NginxProcesses {
    inner: Arc<Inner>,
}

struct Inner {
    master: AtomicI32,
    accumulator: Mutex<Accumulator>,
    num_procs: IntGauge,
    cpu: Counter,
    read_bytes: IntCounter,
    write_bytes: IntCounter,
    resident: IntGauge,
    virtual_: IntGauge,
    oldest_start: Gauge,
    descs: Vec<Desc>,
}

impl NginxProcesses {
    pub fn new(prefix: &str, constant: &HashMap<String, String>) -> Self {
        let o = |name: &str, help: &str| {
            Opts::new(format!("{prefix}nginx_process_{name}"), help).const_labels(constant.clone())
        };
        let num_procs = IntGauge::with_opts(o("num_procs", "number of processes")).expect("a valid gauge");
        let cpu = Counter::with_opts(o("cpu_seconds_total", "Cpu usage in seconds")).expect("a valid counter");
        let read_bytes = IntCounter::with_opts(o("read_bytes_total", "number of bytes read")).expect("a valid counter");
        let write_bytes =
            IntCounter::with_opts(o("write_bytes_total", "number of bytes written")).expect("a valid counter");
        let resident =
            IntGauge::with_opts(o("resident_memory_bytes", "number of bytes of memory in use")).expect("a valid gauge");
        let virtual_ =
            IntGauge::with_opts(o("virtual_memory_bytes", "number of bytes of memory in use")).expect("a valid gauge");
        let oldest_start = Gauge::with_opts(o("oldest_start_time_seconds", "start time in seconds since 1970/01/01"))
            .expect("a valid gauge");
        let mut inner = Inner {
            master: AtomicI32::new(0),
            accumulator: Mutex::new(Accumulator::default()),
            num_procs,
            cpu,
            read_bytes,
            write_bytes,
            resident,
            virtual_,
            oldest_start,
            descs: Vec::new(),
        };
        inner.descs = inner.collectors().into_iter().flat_map(|c| c.desc()).cloned().collect();
        NginxProcesses { inner: Arc::new(inner) }
    }

    /// The nginx master to read, before a scrape (`None`: nginx is down,
    /// the gauges read 0 and the counters keep their values).
    pub fn set_master(&self, pid: Option<i32>) {
        self.inner.master.store(pid.unwrap_or(0), Ordering::Release);
    }

    fn sample(&self) {
        let i = &self.inner;
        let master = i.master.load(Ordering::Acquire);
        // Read and advance under the lock: two scrapes at once (an HA pair
        // of Prometheus servers) must not apply an older reading last.
        let mut accumulator = i.accumulator.lock();
        let readings = if master > 0 {
            match read_group(master) {
                Some(r) => r,
                // `/proc` unreadable this time: keep the counters as they
                // are rather than forget every process and count it again.
                None => return,
            }
        } else {
            Vec::new()
        };
        let growth = accumulator.advance(&readings);
        drop(accumulator);
        let ticks = procfs::ticks_per_second().max(1) as f64;
        i.cpu.inc_by(growth.cpu_ticks as f64 / ticks);
        i.read_bytes.inc_by(growth.read_bytes);
        i.write_bytes.inc_by(growth.write_bytes);
        i.num_procs.set(readings.len() as i64);
        i.resident.set(
            readings
                .iter()
                .map(|r| r.resident_bytes)
                .sum::<u64>()
                .min(i64::MAX as u64) as i64,
        );
        i.virtual_.set(
            readings
                .iter()
                .map(|r| r.virtual_bytes)
                .sum::<u64>()
                .min(i64::MAX as u64) as i64,
        );
        let boot = procfs::boot_time_secs().unwrap_or(0) as f64;
        let oldest = readings.iter().map(|r| r.start_ticks).min();
        i.oldest_start.set(oldest.map_or(0.0, |t| boot + t as f64 / ticks));
    }
}

impl Inner {
    /// The family's metrics, in the order they are written.
    fn collectors(&self) -> [&dyn Collector; 7] {
        [
            &self.num_procs,
            &self.cpu,
            &self.read_bytes,
            &self.write_bytes,
            &self.resident,
            &self.virtual_,
            &self.oldest_start,
        ]
    }
}

/// The master `pid` and its children, as `/proc` has them now (zombies,
/// whose counts are already final and whose memory is gone, left out);
/// `None` when `/proc` cannot be listed.
fn read_group(master: i32) -> Option<Vec<Reading>> {
    let page = procfs::page_size();
    let read = |p: &procfs::process::Process| -> Option<(i32, Reading)> {
        let stat = p.stat().ok()?;
        if stat.state == 'Z' {
            return None;
        }
        let io = p.io().ok();
        Some((
            stat.ppid,
            Reading {
                id: (stat.pid, stat.starttime),
                cpu_ticks: stat.utime + stat.stime,
                read_bytes: io.as_ref().map(|io| io.read_bytes),
                write_bytes: io.as_ref().map(|io| io.write_bytes),
                resident_bytes: stat.rss.saturating_mul(page),
                virtual_bytes: stat.vsize,
                start_ticks: stat.starttime,
            },
        ))
    };
    let all = procfs::process::all_processes().ok()?;
    Some(
        all.filter_map(Result::ok)
            .filter_map(|p| read(&p))
            .filter(|(ppid, r)| r.id.0 == master || *ppid == master)
            .map(|(_, r)| r)
            .collect(),
    )
}

impl Collector for NginxProcesses {
    fn desc(&self) -> Vec<&Desc> {
        self.inner.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.sample();
        self.inner.collectors().into_iter().flat_map(|c| c.collect()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(pid: i32, start: u64, cpu: u64, read: u64) -> Reading {
        Reading {
            id: (pid, start),
            cpu_ticks: cpu,
            read_bytes: Some(read),
            write_bytes: None,
            ..Reading::default()
        }
    }

    #[test]
    fn counters_keep_growing_when_workers_are_replaced() {
        let mut a = Accumulator::default();
        assert_eq!(a.advance(&[r(1, 10, 5, 100), r(2, 11, 7, 0)]).cpu_ticks, 12);
        // Worker 2 exits and worker 3 starts (a reload): 2's last scrape
        // stays counted, 3 adds all it has.
        let g = a.advance(&[r(1, 10, 6, 150), r(3, 20, 4, 10)]);
        assert_eq!((g.cpu_ticks, g.read_bytes), (5, 60));
        // A pid reused by a new process is a new process.
        let g = a.advance(&[r(1, 10, 6, 150), r(3, 30, 2, 0)]);
        assert_eq!(g.cpu_ticks, 2);
    }

    #[test]
    fn the_running_process_group_is_read_from_proc() {
        // This test process stands in for a master: itself, no children.
        let me = std::process::id() as i32;
        let group = read_group(me).unwrap();
        // Other tests may run a child of this process meanwhile.
        let mine = group.iter().find(|r| r.id.0 == me).expect("the process itself");
        assert!(mine.resident_bytes > 0 && mine.virtual_bytes >= mine.resident_bytes);
        let p = NginxProcesses::new("x_", &HashMap::new());
        p.set_master(Some(me));
        let families = p.collect();
        let names: Vec<&str> = families.iter().map(|f| f.name()).collect();
        assert_eq!(
            names,
            [
                "x_nginx_process_num_procs",
                "x_nginx_process_cpu_seconds_total",
                "x_nginx_process_read_bytes_total",
                "x_nginx_process_write_bytes_total",
                "x_nginx_process_resident_memory_bytes",
                "x_nginx_process_virtual_memory_bytes",
                "x_nginx_process_oldest_start_time_seconds"
            ]
        );
        assert!(families[0].get_metric()[0].get_gauge().get_value() >= 1.0);
        assert!(families[6].get_metric()[0].get_gauge().get_value() > 1.6e9);
    }
}
