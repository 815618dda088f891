//! `ingress-controller check`: the migration report. For every Ingress of
//! our class, which `nginx.ingress.kubernetes.io/*` annotations are
//! honoured, which are ignored (this controller does not support them) and
//! which are invalid (and why); the same for the ConfigMap's keys; and
//! anything else the model builder refused (path conflicts, TLS Secrets).
//!
//! It runs the very model builder the controller runs, so what it reports
//! is what the controller would do with the same objects.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::model::annotations::PREFIX;
use crate::model::catalogue::{self, Status};
use crate::model::{build, BuildOptions, Report};
use crate::snapshot::{key, Snapshot};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Applied with ingress-nginx's meaning (see `note` where it differs).
    Honoured,
    /// Not supported here: it changes nothing (or fails closed).
    Ignored,
    /// Supported, but this value was refused.
    Invalid,
}

#[derive(Debug, Clone, Serialize)]
pub struct Item {
    /// The annotation without its prefix, or the ConfigMap key.
    pub name: String,
    pub verdict: Verdict,
    /// Why it is ignored or invalid, or how it differs from ingress-nginx.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ObjectCheck {
    /// `Ingress ns/name` or `ConfigMap ns/name`.
    pub object: String,
    pub items: Vec<Item>,
    /// What else was refused for this object (paths, TLS, backends).
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub ingresses: usize,
    pub honoured: usize,
    pub ignored: usize,
    pub invalid: usize,
    /// Refusals that are not about one annotation or key.
    pub problems: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub objects: Vec<ObjectCheck>,
    pub summary: Summary,
}

impl CheckReport {
    /// Whether switching would drop anything a manifest asks for.
    pub fn drops_anything(&self) -> bool {
        self.summary.ignored + self.summary.invalid + self.summary.problems > 0
    }

    /// Files the source could not read or objects it could not decode.
    pub fn add_source_problems(&mut self, problems: Vec<String>) {
        if problems.is_empty() {
            return;
        }
        self.summary.problems += problems.len();
        self.objects.insert(
            0,
            ObjectCheck {
                object: "manifests".into(),
                items: Vec::new(),
                problems,
            },
        );
    }
}

fn verdict(status: Option<Status>, refused: Option<&Report>) -> (Verdict, String) {
    match (status, refused) {
        (Some(Status::Unsupported(_)) | None, Some(r)) => (Verdict::Ignored, r.reason.clone()),
        (Some(Status::Unsupported(why)), None) => (Verdict::Ignored, why.to_string()),
        (_, Some(r)) => (Verdict::Invalid, r.reason.clone()),
        (Some(Status::Differs(why)), None) => (Verdict::Honoured, why.to_string()),
        (Some(Status::Supported), None) => (Verdict::Honoured, String::new()),
        (None, None) => (Verdict::Ignored, "not an ingress-nginx name".into()),
    }
}

/// Builds the model for `snap` and sorts what it reports by object.
pub fn check(snap: &Snapshot, opts: &BuildOptions) -> CheckReport {
    let model = build(snap, opts);
    // Reports by object, then by what they are about.
    let mut by_object: BTreeMap<&str, Vec<&Report>> = BTreeMap::new();
    for p in &model.problems {
        by_object.entry(p.object.as_str()).or_default().push(p);
    }
    let mut objects = Vec::new();
    let mut summary = Summary::default();
    let mut taken = std::collections::BTreeSet::new();

    if let Some(cm) = &snap.config_map {
        let object = format!("ConfigMap {}", key(&cm.metadata));
        let reports = by_object.get(object.as_str()).cloned().unwrap_or_default();
        let mut items = Vec::new();
        for name in cm.data.iter().flat_map(|d| d.keys()) {
            let what = format!("ConfigMap key {name}");
            let refused = reports.iter().copied().find(|r| r.what == what);
            let (verdict, reason) = verdict(catalogue::config_map_key(name).map(|e| e.status), refused);
            items.push(Item {
                name: name.clone(),
                verdict,
                reason,
            });
        }
        let problems = reports
            .iter()
            .filter(|r| !r.what.starts_with("ConfigMap key "))
            .map(|r| format!("{}: {}", r.what, r.reason))
            .collect();
        taken.insert(object.clone());
        objects.push(ObjectCheck {
            object,
            items,
            problems,
        });
    }

    let mut ingresses: Vec<_> = snap
        .ingresses
        .iter()
        .filter(|i| opts.class.accepts(i, &snap.classes))
        .filter(|i| {
            opts.namespace
                .as_deref()
                .is_none_or(|ns| i.metadata.namespace.as_deref() == Some(ns))
        })
        .collect();
    ingresses.sort_by_key(|i| key(&i.metadata));
    for ing in ingresses {
        summary.ingresses += 1;
        let object = format!("Ingress {}", key(&ing.metadata));
        let reports = by_object.get(object.as_str()).cloned().unwrap_or_default();
        let mut items = Vec::new();
        for full in ing.metadata.annotations.iter().flat_map(|a| a.keys()) {
            let Some(name) = full.strip_prefix(PREFIX) else {
                continue;
            };
            let refused = reports.iter().copied().find(|r| &r.what == full);
            let (verdict, reason) = verdict(catalogue::annotation(name).map(|e| e.status), refused);
            items.push(Item {
                name: name.to_string(),
                verdict,
                reason,
            });
        }
        let problems = reports
            .iter()
            .filter(|r| !r.what.starts_with(PREFIX))
            .map(|r| format!("{}: {}", r.what, r.reason))
            .collect();
        taken.insert(object.clone());
        objects.push(ObjectCheck {
            object,
            items,
            problems,
        });
    }
    // Refusals about other objects (Services, Secrets, the default backend).
    for (object, reports) in &by_object {
        if !taken.contains(*object) {
            objects.push(ObjectCheck {
                object: object.to_string(),
                items: Vec::new(),
                problems: reports.iter().map(|r| format!("{}: {}", r.what, r.reason)).collect(),
            });
        }
    }
    for o in &objects {
        for i in &o.items {
            match i.verdict {
                Verdict::Honoured => summary.honoured += 1,
                Verdict::Ignored => summary.ignored += 1,
                Verdict::Invalid => summary.invalid += 1,
            }
        }
        summary.problems += o.problems.len();
    }
    CheckReport { objects, summary }
}

/// The report as text, one block per object.
pub fn text(r: &CheckReport) -> String {
    let mut out = String::new();
    for o in &r.objects {
        let _ = writeln!(out, "{}", o.object);
        for i in &o.items {
            let mark = match i.verdict {
                Verdict::Honoured => "ok     ",
                Verdict::Ignored => "IGNORED",
                Verdict::Invalid => "INVALID",
            };
            let sep = if i.reason.is_empty() { "" } else { ": " };
            let _ = writeln!(out, "  {mark} {}{sep}{}", i.name, i.reason);
        }
        for p in &o.problems {
            let _ = writeln!(out, "  PROBLEM {p}");
        }
    }
    let s = &r.summary;
    let _ = writeln!(
        out,
        "\n{} Ingresses: {} honoured, {} ignored, {} invalid, {} other problems",
        s.ingresses, s.honoured, s.ignored, s.invalid, s.problems
    );
    out
}
