//! The head sampler: which requests' spans are recorded and exported, as
//! the OpenTelemetry SDK's samplers decide (`AlwaysOn`, `AlwaysOff`,
//! `TraceIdRatioBased`, each optionally parent-based), with
//! ingress-nginx's names for them (`otel-sampler`).
//!
//! The ratio is decided from the trace id alone, so every hop that uses
//! the same ratio (two nginx tiers, say) makes the same choice for a
//! trace. It reads the id's last 8 bytes, which are random in every id
//! this module or a W3C-conformant caller makes.

use super::trace_context::{TraceId, TraceParent};

/// The root sampler (`otel-sampler`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Root {
    AlwaysOn,
    AlwaysOff,
    /// A fraction in `[0, 1]`, turned into a threshold once.
    Ratio(f64),
}

/// A configured sampler.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampler {
    pub root: Root,
    /// `otel-sampler-parent-based`: a request with a trusted parent follows
    /// the parent's `sampled` flag; the root sampler decides the others.
    pub parent_based: bool,
    threshold: u64,
}

impl Sampler {
    /// The OpenTelemetry SDK's default: parent-based, always on.
    pub const DEFAULT: Sampler = Sampler {
        root: Root::AlwaysOn,
        parent_based: true,
        threshold: u64::MAX,
    };

    pub fn new(root: Root, parent_based: bool) -> Sampler {
        let threshold = match root {
            Root::AlwaysOn => u64::MAX,
            Root::AlwaysOff => 0,
            Root::Ratio(r) if r >= 1.0 => u64::MAX,
            Root::Ratio(r) if r > 0.0 => (r * 18_446_744_073_709_551_616.0) as u64,
            Root::Ratio(_) => 0,
        };
        Sampler {
            root,
            parent_based,
            threshold,
        }
    }

    /// Parses ingress-nginx's sampler name (`AlwaysOn`, `AlwaysOff`,
    /// `TraceIdRatioBased`) with its ratio.
    pub fn from_names(name: &str, ratio: f64, parent_based: bool) -> Result<Sampler, String> {
        let root = match name {
            "AlwaysOn" => Root::AlwaysOn,
            "AlwaysOff" => Root::AlwaysOff,
            "TraceIdRatioBased" => {
                if !(0.0..=1.0).contains(&ratio) {
                    return Err(format!("the sampler ratio must be between 0 and 1, not {ratio}"));
                }
                Root::Ratio(ratio)
            }
            other => {
                return Err(format!(
                    "unknown sampler {other:?} (AlwaysOn, AlwaysOff or TraceIdRatioBased)"
                ))
            }
        };
        Ok(Sampler::new(root, parent_based))
    }

    /// Whether a request of trace `trace_id`, with `parent` when it has a
    /// trusted one, is sampled.
    pub fn should_sample(&self, trace_id: &TraceId, parent: Option<&TraceParent>) -> bool {
        if self.parent_based {
            if let Some(p) = parent {
                return p.sampled();
            }
        }
        match self.root {
            Root::AlwaysOn => true,
            Root::AlwaysOff => false,
            Root::Ratio(_) => {
                let low = u64::from_be_bytes(trace_id[8..16].try_into().expect("8 bytes"));
                // u64::MAX stands for "always": no id is excluded at 1.0.
                self.threshold == u64::MAX || low < self.threshold
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otel::ids::IdGenerator;

    #[test]
    fn ingress_nginx_names_parse() {
        assert_eq!(
            Sampler::from_names("AlwaysOn", 0.5, false).unwrap().root,
            Root::AlwaysOn
        );
        assert_eq!(
            Sampler::from_names("AlwaysOff", 0.5, true).unwrap().root,
            Root::AlwaysOff
        );
        assert_eq!(
            Sampler::from_names("TraceIdRatioBased", 0.25, false).unwrap().root,
            Root::Ratio(0.25)
        );
        assert!(Sampler::from_names("TraceIdRatioBased", 1.5, false).is_err());
        assert!(Sampler::from_names("alwayson", 1.0, false).is_err());
    }

    #[test]
    fn a_ratio_samples_about_that_fraction() {
        let mut g = IdGenerator::from_seed([7; 32]);
        for ratio in [0.0, 0.01, 0.5, 1.0] {
            let s = Sampler::new(Root::Ratio(ratio), false);
            let n = 100_000;
            let sampled = (0..n).filter(|_| s.should_sample(&g.trace_id(), None)).count();
            let got = sampled as f64 / n as f64;
            assert!((got - ratio).abs() < 0.005, "ratio {ratio}: sampled {got}");
        }
    }

    #[test]
    fn parent_based_follows_the_parent_and_the_root_decides_the_rest() {
        let mut g = IdGenerator::from_seed([1; 32]);
        let t = g.trace_id();
        let parent = |flags| TraceParent {
            trace_id: t,
            span_id: [1; 8],
            flags,
        };
        let s = Sampler::new(Root::AlwaysOff, true);
        assert!(s.should_sample(&t, Some(&parent(1))));
        assert!(!s.should_sample(&t, Some(&parent(0))));
        assert!(!s.should_sample(&t, None));
        let s = Sampler::new(Root::AlwaysOn, false);
        assert!(
            s.should_sample(&t, Some(&parent(0))),
            "not parent-based: the root decides"
        );
    }

    #[test]
    fn the_decision_depends_on_the_trace_only() {
        let mut g = IdGenerator::from_seed([3; 32]);
        let s = Sampler::new(Root::Ratio(0.3), false);
        for _ in 0..1000 {
            let t = g.trace_id();
            assert_eq!(
                s.should_sample(&t, None),
                Sampler::new(Root::Ratio(0.3), false).should_sample(&t, None)
            );
        }
    }
}
