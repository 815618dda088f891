//! The diff between the backends the module holds and the ones the model
//! wants: a pure function, so the dynamic path's decisions are unit-tested.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use lua_compat::wire::Backend;

/// What a round of pushing must do to bring the module from `have` to
/// `desired`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// New or changed backends, by name.
    pub puts: Vec<String>,
    /// Backends to remove.
    pub deletes: Vec<String>,
}

/// The pure diff: changed or new backends are put; backends that are gone
/// are deleted, except those the running nginx.conf still routes to (they
/// go after the reload that drops them). Backends `excluded` (refused by
/// the module) count as gone.
///
/// An unchanged backend is the same `Arc` in both maps: after an endpoint
/// change only the backends of the Services it touched are compared in
/// full, so a round costs a pointer comparison per backend, not a deep one.
pub fn plan(
    have: &BTreeMap<String, Arc<Backend>>,
    desired: &BTreeMap<String, Arc<Backend>>,
    still_routed: &BTreeSet<String>,
    excluded: impl Fn(&str) -> bool,
) -> Plan {
    let same = |a: &Arc<Backend>, b: &Arc<Backend>| Arc::ptr_eq(a, b) || a == b;
    Plan {
        puts: desired
            .iter()
            .filter(|(k, b)| !excluded(k) && !have.get(*k).is_some_and(|h| same(h, b)))
            .map(|(k, _)| k.clone())
            .collect(),
        deletes: have
            .keys()
            .filter(|k| (!desired.contains_key(*k) || excluded(k)) && !still_routed.contains(*k))
            .cloned()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(name: &str, port: u16) -> (String, Arc<Backend>) {
        let json = serde_json::json!({"name": name, "endpoints": [{"address": "10.0.0.1", "port": port}]});
        (name.to_string(), Arc::new(serde_json::from_value(json).unwrap()))
    }

    fn plan(
        have: &BTreeMap<String, Arc<Backend>>,
        desired: &BTreeMap<String, Arc<Backend>>,
        still_routed: &BTreeSet<String>,
    ) -> Plan {
        super::plan(have, desired, still_routed, |_| false)
    }

    #[test]
    fn excluded_backends_are_not_put_and_are_deleted() {
        let have: BTreeMap<_, _> = [b("a", 80), b("b", 80)].into();
        let desired: BTreeMap<_, _> = [b("a", 81), b("b", 80), b("c", 80)].into();
        let p = super::plan(&have, &desired, &BTreeSet::new(), |n| n == "a" || n == "c");
        assert_eq!(
            p,
            Plan {
                puts: vec![],
                deletes: vec!["a".into()],
            }
        );
    }

    #[test]
    fn plans_puts_for_changes_and_holds_deletes_still_routed() {
        let have: BTreeMap<_, _> = [b("a", 80), b("b", 80), b("c", 80)].into();
        let desired: BTreeMap<_, _> = [b("a", 80), b("b", 81), b("d", 80)].into();
        let routed: BTreeSet<String> = ["c".to_string()].into();
        assert_eq!(
            plan(&have, &desired, &routed),
            Plan {
                puts: vec!["b".into(), "d".into()],
                deletes: vec![],
            }
        );
        assert_eq!(plan(&have, &desired, &BTreeSet::new()).deletes, ["c"]);
        assert_eq!(plan(&desired, &desired, &routed), Plan::default());
    }

    proptest::proptest! {
        /// Applying a plan to what the module holds gives exactly the
        /// desired backends, plus those still routed that were held back.
        #[test]
        fn a_plan_brings_the_module_to_the_model(
            have in proptest::collection::btree_map("[a-e]", 80u16..83, 0..5),
            desired in proptest::collection::btree_map("[a-e]", 80u16..83, 0..5),
            routed in proptest::collection::btree_set("[a-e]", 0..3),
        ) {
            let have: BTreeMap<_, _> = have.iter().map(|(k, p)| b(k, *p)).collect();
            let desired: BTreeMap<_, _> = desired.iter().map(|(k, p)| b(k, *p)).collect();
            let p = plan(&have, &desired, &routed);
            let mut after = have.clone();
            for k in &p.deletes {
                proptest::prop_assert!(after.remove(k).is_some(), "deleted {} which it did not hold", k);
            }
            for k in &p.puts {
                after.insert(k.clone(), desired[k].clone());
            }
            for (k, v) in &after {
                match desired.get(k) {
                    Some(want) => proptest::prop_assert_eq!(v, want),
                    None => proptest::prop_assert!(routed.contains(k), "{} kept but not routed", k),
                }
            }
            proptest::prop_assert!(desired.keys().all(|k| after.contains_key(k)));
            proptest::prop_assert!(p.puts.iter().all(|k| have.get(k) != desired.get(k)), "a put of an unchanged backend");
        }
    }
}
