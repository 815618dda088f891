//! chashsubset (`upstream-hash-by-subset`): the key picks a subset of
//! endpoints on a ring of subsets (`set1`, `set2`, ... as Lua names them),
//! then a random member of it serves; see [`crate::algorithm::subsets`].

use super::{random_where, Accept, Attempt, Endpoints, Pick, Selection, Worker};
use crate::algorithm::{subsets, Algorithm};
use crate::chash::ChashRing;
use crate::hash_key::HashKey;
use crate::runtime::RuntimeBackend;

pub struct ChashSubsetSelector {
    pub(super) key: HashKey,
    /// A ring over the subsets, not over endpoints.
    ring: ChashRing,
    subsets: Vec<Vec<usize>>,
    endpoints: usize,
}

impl ChashSubsetSelector {
    /// Points on its hash ring.
    pub(super) fn ring_len(&self) -> usize {
        self.ring.len()
    }
}

impl Selection for ChashSubsetSelector {
    fn build(backend: &RuntimeBackend, _: Worker) -> Self {
        let Algorithm::ChashSubset { key, subset_size } = &backend.algorithm else {
            unreachable!("Selector::build dispatches on the algorithm")
        };
        let subsets = subsets(backend.endpoints.len(), *subset_size);
        let ids: Vec<String> = (1..=subsets.len()).map(|i| format!("set{i}")).collect();
        ChashSubsetSelector {
            key: key.clone(),
            ring: ChashRing::new(ids.iter().map(|id| (id.as_str(), 1))),
            subsets,
            endpoints: backend.endpoints.len(),
        }
    }

    /// A random accepted member of the key's subset; when the subset has
    /// none, a random accepted endpoint of the whole backend.
    fn pick(&self, attempt: &Attempt<'_>, _: &impl Endpoints, accept: impl Accept) -> Option<Pick> {
        let (set, _) = self.ring.find(attempt.hash_key)?;
        let members = self.subsets.get(set)?;
        // Subsets are small (the default is 3): counting twice beats
        // allocating the accepted members.
        let accepted = members.iter().filter(|i| accept(**i)).count();
        let endpoint = if accepted == 0 {
            random_where(self.endpoints, accept)?
        } else {
            let k = fastrand::usize(..accepted);
            *members.iter().filter(|i| accept(**i)).nth(k).expect("k < accepted")
        };
        Some(Pick::of(endpoint))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn a_key_stays_in_its_subset_until_the_subset_is_used_up() {
        let algorithm = Algorithm::ChashSubset {
            key: HashKey::parse("$request_uri"),
            subset_size: 3,
        };
        let selector = Selector::build(&backend(algorithm, &[1; 9]), WORKER);
        let table = Table::healthy(9);
        let attempt = Attempt {
            hash_key: b"/user/7",
            ..Attempt::default()
        };
        let set: std::collections::BTreeSet<usize> = (0..60)
            .map(|_| select(&selector, &attempt, &table, &TriedSet::new()).unwrap().endpoint)
            .collect();
        assert_eq!(set.len(), 3, "{set:?}");
        let mut tried = TriedSet::new();
        for i in &set {
            tried.insert(*i);
        }
        let outside = select(&selector, &attempt, &table, &tried).unwrap().endpoint;
        assert!(!set.contains(&outside));
    }
}
