//! chash: `upstream-hash-by` on resty.chash's ring (see [`crate::chash`]).
//! An endpoint the request cannot use is skipped by walking on along the
//! ring, so the other keys keep their endpoints.

use super::{node_ids, Accept, Attempt, Endpoints, Pick, Selection, Worker};
use crate::algorithm::Algorithm;
use crate::chash::ChashRing;
use crate::hash_key::HashKey;
use crate::runtime::RuntimeBackend;

pub struct ChashSelector {
    pub(super) key: HashKey,
    ring: ChashRing,
    endpoints: usize,
}

impl ChashSelector {
    /// Points on its hash ring.
    pub(super) fn ring_len(&self) -> usize {
        self.ring.len()
    }
}

impl Selection for ChashSelector {
    fn build(backend: &RuntimeBackend, _: Worker) -> Self {
        let Algorithm::Chash { key } = &backend.algorithm else {
            unreachable!("Selector::build dispatches on the algorithm")
        };
        let ids = node_ids(backend);
        ChashSelector {
            key: key.clone(),
            ring: ChashRing::new(
                ids.iter()
                    .zip(&backend.endpoints)
                    .map(|(id, e)| (id.as_str(), e.weight)),
            ),
            endpoints: ids.len(),
        }
    }

    fn pick(&self, attempt: &Attempt<'_>, _: &impl Endpoints, accept: impl Accept) -> Option<Pick> {
        self.ring
            .find_usable(attempt.hash_key, self.endpoints, accept)
            .map(Pick::of)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn a_key_keeps_its_endpoint_and_walks_on_when_it_is_down() {
        let algorithm = Algorithm::Chash {
            key: HashKey::parse("$request_uri"),
        };
        let selector = Selector::build(&backend(algorithm, &[1, 1, 1, 1]), WORKER);
        let mut table = Table::healthy(4);
        let attempt = Attempt {
            hash_key: b"/cart",
            ..Attempt::default()
        };
        let first = select(&selector, &attempt, &table, &TriedSet::new()).unwrap().endpoint;
        for _ in 0..10 {
            assert_eq!(
                select(&selector, &attempt, &table, &TriedSet::new()).unwrap().endpoint,
                first
            );
        }
        table.down[first] = true;
        let next = select(&selector, &attempt, &table, &TriedSet::new()).unwrap().endpoint;
        assert_ne!(next, first);
        let mut tried = TriedSet::new();
        tried.insert(next);
        let third = select(&selector, &attempt, &table, &tried).unwrap().endpoint;
        assert!(third != first && third != next);
    }
}
