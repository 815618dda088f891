//! One cell of request counters: what one worker counted for one series.
//!
//! A cell is plain atomics (`#[repr(C)]`, all zero when new), so it can live
//! in shared memory: the worker that owns it adds with relaxed atomics, and
//! the API sums cells while workers keep adding. During a reload the old and
//! the new worker with the same number share their cells, which the atomic
//! adds keep exact.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// ingress-nginx's `--time-buckets` default (Prometheus' `DefBuckets`), in
/// milliseconds: nginx measures request and upstream times in whole ms.
pub const TIME_BUCKETS_MS: [u64; 11] = [5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000];
/// ingress-nginx's `--length-buckets` default: linear, 10 to 100 bytes.
pub const LENGTH_BUCKETS: [u64; 10] = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100];
/// ingress-nginx's `--size-buckets` default: exponential, 10 B to 10 MB.
pub const SIZE_BUCKETS: [u64; 7] = [10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];

/// The bucket of `value`: the first bound at least `value` (Prometheus'
/// `le`), or `N` above them all. A scan that stops early: request times
/// are mostly in the first buckets.
fn bucket<const N: usize>(bounds: &[u64; N], value: u64) -> usize {
    bounds.iter().position(|&b| value <= b).unwrap_or(N)
}

/// The bucket of a request or response length in [`LENGTH_BUCKETS`], by
/// arithmetic: those bounds are 10 apart, and most lengths are above them
/// all, where a scan would compare with every bound.
fn length_bucket(value: u64) -> usize {
    (value.saturating_sub(1) / 10).min(LENGTH_BUCKETS.len() as u64) as usize
}

/// A histogram over `N` upper bounds: a count per bucket (not cumulative;
/// the last slot is above every bound) and the sum of the observations.
#[repr(C)]
pub struct Histogram<const N: usize> {
    counts: [AtomicU64; N],
    over: AtomicU64,
    sum: AtomicU64,
}

impl<const N: usize> Histogram<N> {
    fn observe(&self, bounds: &[u64; N], value: u64) {
        self.add(bucket(bounds, value), value);
    }

    /// Counts `value` in bucket `index` ([`N`] for above every bound).
    fn add(&self, index: usize, value: u64) {
        self.counts.get(index).unwrap_or(&self.over).fetch_add(1, Relaxed);
        self.sum.fetch_add(value, Relaxed);
    }

    fn snapshot(&self) -> HistogramSnapshot<N> {
        HistogramSnapshot {
            counts: std::array::from_fn(|i| self.counts[i].load(Relaxed)),
            over: self.over.load(Relaxed),
            sum: self.sum.load(Relaxed),
        }
    }
}

/// A histogram's values at one moment; addable across workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistogramSnapshot<const N: usize> {
    pub counts: [u64; N],
    pub over: u64,
    pub sum: u64,
}

impl<const N: usize> Default for HistogramSnapshot<N> {
    fn default() -> Self {
        HistogramSnapshot {
            counts: [0; N],
            over: 0,
            sum: 0,
        }
    }
}

impl<const N: usize> HistogramSnapshot<N> {
    /// Observations in all buckets.
    pub fn count(&self) -> u64 {
        self.counts.iter().fold(self.over, |a, c| a.wrapping_add(*c))
    }

    /// Cumulative counts for each bound, as the `le` buckets show them.
    pub fn cumulative(&self) -> [u64; N] {
        let mut acc = 0u64;
        std::array::from_fn(|i| {
            acc = acc.wrapping_add(self.counts[i]);
            acc
        })
    }

    fn add(&mut self, other: &Self) {
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a = a.wrapping_add(b);
        }
        self.over = self.over.wrapping_add(other.over);
        self.sum = self.sum.wrapping_add(other.sum);
    }
}

/// What the log phase measured for one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// `$request_time`, in ms.
    pub request_ms: u64,
    /// The sum of `$upstream_response_time` over the attempts that got a
    /// response, in ms; `None` when no attempt did (ingress-nginx observes
    /// nothing then either).
    pub upstream_ms: Option<u64>,
    /// The sum of `$upstream_connect_time` over the attempts that
    /// connected, in ms; `None` when none did.
    pub connect_ms: Option<u64>,
    /// The sum of `$upstream_header_time` over the attempts that got a
    /// response header, in ms; `None` when none did.
    pub header_ms: Option<u64>,
    /// `$request_length`.
    pub request_length: u64,
    /// `$bytes_sent`.
    pub bytes_sent: u64,
    /// Attempts whose connection to the endpoint failed.
    pub connect_errors: u64,
}

/// One worker's counters for one series.
#[repr(C)]
pub struct Counters {
    request_time: Histogram<11>,
    upstream_time: Histogram<11>,
    connect_time: Histogram<11>,
    header_time: Histogram<11>,
    request_size: Histogram<10>,
    response_size: Histogram<10>,
    bytes_sent: Histogram<7>,
    connect_errors: AtomicU64,
}

impl Counters {
    /// Counts one request: a dozen relaxed atomic adds, no allocation.
    pub fn record(&self, s: &Sample) {
        self.request_time.observe(&TIME_BUCKETS_MS, s.request_ms);
        if let Some(ms) = s.upstream_ms {
            self.upstream_time.observe(&TIME_BUCKETS_MS, ms);
        }
        if let Some(ms) = s.connect_ms {
            self.connect_time.observe(&TIME_BUCKETS_MS, ms);
        }
        if let Some(ms) = s.header_ms {
            self.header_time.observe(&TIME_BUCKETS_MS, ms);
        }
        self.request_size.add(length_bucket(s.request_length), s.request_length);
        self.response_size.add(length_bucket(s.bytes_sent), s.bytes_sent);
        self.bytes_sent.observe(&SIZE_BUCKETS, s.bytes_sent);
        if s.connect_errors > 0 {
            self.connect_errors.fetch_add(s.connect_errors, Relaxed);
        }
    }

    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            request_time: self.request_time.snapshot(),
            upstream_time: self.upstream_time.snapshot(),
            connect_time: self.connect_time.snapshot(),
            header_time: self.header_time.snapshot(),
            request_size: self.request_size.snapshot(),
            response_size: self.response_size.snapshot(),
            bytes_sent: self.bytes_sent.snapshot(),
            connect_errors: self.connect_errors.load(Relaxed),
        }
    }
}

#[cfg(test)]
impl Default for Counters {
    fn default() -> Self {
        // SAFETY: `Counters` is atomics only, for which all-zero is the value 0.
        unsafe { std::mem::zeroed() }
    }
}

/// A cell's values at one moment, or the sum of several cells'.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    pub request_time: HistogramSnapshot<11>,
    pub upstream_time: HistogramSnapshot<11>,
    pub connect_time: HistogramSnapshot<11>,
    pub header_time: HistogramSnapshot<11>,
    pub request_size: HistogramSnapshot<10>,
    pub response_size: HistogramSnapshot<10>,
    pub bytes_sent: HistogramSnapshot<7>,
    pub connect_errors: u64,
}

impl CountersSnapshot {
    /// Requests counted (every request is in `request_time`).
    pub fn requests(&self) -> u64 {
        self.request_time.count()
    }

    pub fn add(&mut self, other: &Self) {
        self.request_time.add(&other.request_time);
        self.upstream_time.add(&other.upstream_time);
        self.connect_time.add(&other.connect_time);
        self.header_time.add(&other.header_time);
        self.request_size.add(&other.request_size);
        self.response_size.add(&other.response_size);
        self.bytes_sent.add(&other.bytes_sent);
        self.connect_errors = self.connect_errors.wrapping_add(other.connect_errors);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn all_zero_bytes_are_an_empty_cell() {
        // The module zeroes a cell's shared memory and uses it as is.
        let c = Counters::default();
        assert_eq!(c.snapshot(), CountersSnapshot::default());
    }

    #[test]
    fn a_value_on_a_bound_falls_in_that_bucket() {
        let c = Counters::default();
        for ms in [0, 5, 6, 10_000, 10_001] {
            c.record(&Sample {
                request_ms: ms,
                ..Sample::default()
            });
        }
        let s = c.snapshot();
        assert_eq!(s.request_time.cumulative()[0], 2); // 0 and 5 (le=0.005)
        assert_eq!(s.request_time.cumulative()[1], 3); // + 6
        assert_eq!(s.request_time.cumulative()[10], 4); // + 10000 (le=10)
        assert_eq!(s.request_time.count(), 5);
        assert_eq!(s.request_time.over, 1);
        assert_eq!(s.request_time.sum, 20_012);
        assert_eq!(s.upstream_time.count(), 0);
    }

    #[test]
    fn a_sample_feeds_every_histogram() {
        let c = Counters::default();
        c.record(&Sample {
            request_ms: 12,
            upstream_ms: Some(7),
            connect_ms: Some(1),
            header_ms: Some(6),
            request_length: 55,
            bytes_sent: 1234,
            connect_errors: 2,
        });
        let s = c.snapshot();
        assert_eq!(s.requests(), 1);
        assert_eq!(s.upstream_time.sum, 7);
        assert_eq!((s.connect_time.sum, s.connect_time.cumulative()[0]), (1, 1));
        assert_eq!((s.header_time.sum, s.header_time.cumulative()[1]), (6, 1));
        assert_eq!(s.request_size.cumulative()[5], 1); // le=60
        assert_eq!(s.request_size.cumulative()[4], 0);
        assert_eq!(s.response_size.over, 1); // above 100
        assert_eq!(s.bytes_sent.cumulative()[3], 1); // le=10000
        assert_eq!(s.bytes_sent.cumulative()[2], 0);
        assert_eq!(s.connect_errors, 2);
    }

    proptest! {
        /// Counting samples in several cells and summing the snapshots is
        /// the same as counting them all in one cell: what the API shows
        /// does not depend on how requests spread over workers.
        #[test]
        fn summing_cells_is_counting_in_one(samples in prop::collection::vec(
            (0u64..20_000, prop::option::of(0u64..20_000), prop::option::of(0u64..200), 0u64..500, 0u64..20_000_000, 0u64..3), 0..60),
            split in 0usize..60)
        {
            let one = Counters::default();
            let (a, b) = (Counters::default(), Counters::default());
            for (i, (r, u, c, l, s, e)) in samples.iter().enumerate() {
                let sample = Sample { request_ms: *r, upstream_ms: *u, connect_ms: *c, header_ms: u.map(|u| u / 2), request_length: *l, bytes_sent: *s, connect_errors: *e };
                one.record(&sample);
                if i < split { a.record(&sample) } else { b.record(&sample) }
            }
            let mut sum = a.snapshot();
            sum.add(&b.snapshot());
            prop_assert_eq!(sum, one.snapshot());
            prop_assert_eq!(sum.requests(), samples.len() as u64);
            let cumulative = sum.request_time.cumulative();
            prop_assert!(cumulative.windows(2).all(|w| w[0] <= w[1]));
            prop_assert_eq!(cumulative[10] + sum.request_time.over, samples.len() as u64);
        }

        /// A value lands in the first bucket whose bound is at least the
        /// value (Prometheus' `le`), or above them all.
        #[test]
        fn a_value_lands_in_the_first_bucket_that_holds_it(value in prop_oneof![
            0u64..12_000,
            prop::sample::select(TIME_BUCKETS_MS.to_vec()),
            any::<u64>(),
        ]) {
            // SAFETY: a histogram is atomics only; all-zero is the value 0.
            let h: Histogram<11> = unsafe { std::mem::zeroed() };
            h.observe(&TIME_BUCKETS_MS, value);
            let s = h.snapshot();
            match TIME_BUCKETS_MS.iter().position(|&b| value <= b) {
                Some(i) => prop_assert_eq!(s.counts[i], 1),
                None => prop_assert_eq!(s.over, 1),
            }
            prop_assert_eq!(s.count(), 1);
        }

        /// The arithmetic length bucket is the scan's.
        #[test]
        fn the_length_bucket_is_the_scanned_one(value in prop_oneof![0u64..130, any::<u64>()]) {
            prop_assert_eq!(length_bucket(value), bucket(&LENGTH_BUCKETS, value));
        }
    }
}
