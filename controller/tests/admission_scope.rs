//! The webhook judges an Ingress on the part of the cluster that can
//! change its verdict (`admission::scope::related`), not on all of it.
//! Over every golden case, each Ingress gets exactly the problems from the
//! scoped snapshot that it gets from the whole one.

mod common;

use std::sync::Arc;

use controller::admission::scope::related;
use controller::model::build;
use controller::snapshot::key;

#[test]
fn every_golden_ingress_gets_the_same_verdict_from_its_scope() {
    let mut checked = 0;
    for dir in common::cases() {
        let case = dir.file_name().unwrap().to_string_lossy().to_string();
        let opts = common::options(&case);
        let snap = common::snapshot(&dir);
        let whole = build(&snap, &opts);
        for ing in &snap.ingresses {
            let me = key(&ing.metadata);
            let object = format!("Ingress {me}");
            let mine = |problems: &[controller::model::Report]| {
                let mut v: Vec<String> = problems
                    .iter()
                    .filter(|p| p.object == object)
                    .map(ToString::to_string)
                    .collect();
                v.sort();
                v
            };
            let mut scoped = related(&snap, ing, &opts);
            scoped.ingresses.retain(|i| key(&i.metadata) != me);
            scoped.ingresses.push(Arc::clone(ing));
            let narrow = build(&scoped, &opts);
            assert_eq!(mine(&narrow.problems), mine(&whole.problems), "{case}: {me}");
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} Ingresses checked");
}
