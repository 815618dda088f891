//! An endpoint change builds only the backends it touches
//! ([`update_endpoints`]); the result must be exactly what a full build of
//! the new snapshot gives. Checked over every golden case (canaries,
//! affinity shared with canaries, `default-backend` fallbacks, layer-4
//! ports, ExternalName Services, refused endpoints), with every Service
//! and every EndpointSlice taken away in turn, all slices taken away, and
//! every slice's endpoints moved.

use std::sync::Arc;

mod common;

use common::options;
use controller::model::{build, update_endpoints, BuildOptions, Model};
use controller::snapshot::{change, Change, Snapshot};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The backends and problems of a model, comparable.
fn outcome(m: &Model) -> (Vec<String>, Vec<String>) {
    let backends = m
        .backends
        .iter()
        .map(|(k, b)| format!("{k}: {}", serde_json::to_string(&**b).unwrap()))
        .collect();
    let mut problems: Vec<String> = m.problems.iter().map(ToString::to_string).collect();
    problems.sort();
    (backends, problems)
}

/// Checks one variant: returns whether it was applied as an endpoint
/// change (`false`: the change touched a Service the structure depends
/// on, and a full build is the right answer).
fn check(case: &str, what: &str, prev: &Model, old: &Snapshot, new: &Snapshot, opts: &BuildOptions) -> bool {
    let Change::Endpoints(services) = change(old, new) else {
        panic!("{case}, {what}: only Services and EndpointSlices changed, yet the change is not an endpoint change");
    };
    let Some(updated) = update_endpoints(prev, new, &services, opts) else {
        return false;
    };
    let full = build(new, opts);
    assert_eq!(
        outcome(&updated),
        outcome(&full),
        "{case}, {what}: the endpoint update differs from a full build"
    );
    assert!(
        Arc::ptr_eq(updated.structure.as_ref().unwrap(), prev.structure.as_ref().unwrap()),
        "{case}, {what}: the structure is shared, not rebuilt"
    );
    assert_eq!(
        updated.structure, full.structure,
        "{case}, {what}: the structure changed"
    );
    true
}

/// `slice` with its endpoints on other addresses (and without the ones
/// not ready).
fn moved(slice: &EndpointSlice) -> Arc<EndpointSlice> {
    let mut s = slice.clone();
    for (i, e) in s.endpoints.iter_mut().flatten().enumerate() {
        e.addresses = vec![format!("10.77.{}.{}", i / 200, i % 200 + 1)];
    }
    if s.address_type != "IPv4" {
        s.address_type = "IPv4".into();
    }
    Arc::new(s)
}

#[test]
fn an_endpoint_update_equals_a_full_build() {
    let mut applied = 0;
    for dir in common::cases() {
        let case = dir.file_name().unwrap().to_string_lossy().to_string();
        let opts = options(&case);
        let old = common::snapshot(&dir);
        let prev = build(&old, &opts);
        let mut variants: Vec<(String, Snapshot)> = Vec::new();
        for i in 0..old.slices.len() {
            let mut slices = old.slices.clone();
            let gone = slices.remove(i);
            variants.push((
                format!("slice {:?} removed", gone.metadata.name),
                Snapshot { slices, ..old.clone() },
            ));
            let mut slices = old.slices.clone();
            slices[i] = moved(&old.slices[i]);
            variants.push((
                format!("slice {:?} moved", gone.metadata.name),
                Snapshot { slices, ..old.clone() },
            ));
        }
        for i in 0..old.services.len() {
            let mut services = old.services.clone();
            let gone = services.remove(i);
            let what = format!("Service {:?} removed", gone.metadata.name);
            variants.push((
                what,
                Snapshot {
                    services,
                    ..old.clone()
                },
            ));
        }
        variants.push((
            "every slice removed".into(),
            Snapshot {
                slices: Vec::new(),
                ..old.clone()
            },
        ));
        let all_moved = old.slices.iter().map(|s| moved(s)).collect();
        variants.push((
            "every slice moved".into(),
            Snapshot {
                slices: all_moved,
                ..old.clone()
            },
        ));
        for (what, new) in &variants {
            applied += usize::from(check(&case, what, &prev, &old, new, &opts));
        }
    }
    assert!(applied > 50, "only {applied} variants were endpoint updates");
}

#[test]
fn a_change_elsewhere_is_not_an_endpoint_change() {
    let dir = common::cases().into_iter().find(|d| d.ends_with("canary")).unwrap();
    let old = common::snapshot(&dir);
    let mut ingresses = old.ingresses.clone();
    ingresses[0] = Arc::new((*ingresses[0]).clone());
    assert_eq!(
        change(
            &old,
            &Snapshot {
                ingresses,
                ..old.clone()
            }
        ),
        Change::Other
    );
}
