//! The diff between the backends the module holds and the ones the model
//! wants: a pure function, so the dynamic path's decisions are unit-tested.

use std::collections::{BTreeMap, BTreeSet};

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
/// go after the reload that drops them).
pub fn plan(
    have: &BTreeMap<String, Backend>,
    desired: &BTreeMap<String, Backend>,
    still_routed: &BTreeSet<String>,
) -> Plan {
    Plan {
        puts: desired
            .iter()
            .filter(|(k, b)| have.get(*k) != Some(b))
            .map(|(k, _)| k.clone())
            .collect(),
        deletes: have
            .keys()
            .filter(|k| !desired.contains_key(*k) && !still_routed.contains(*k))
            .cloned()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(name: &str, port: u16) -> (String, Backend) {
        let json = serde_json::json!({"name": name, "endpoints": [{"address": "10.0.0.1", "port": port}]});
        (name.to_string(), serde_json::from_value(json).unwrap())
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
