//! least_conn: the fewest open connections relative to weight (see
//! [`crate::least_conn`]); the counts are shared by all workers.

use super::{Accept, Attempt, Endpoints, Pick, Selection, Worker};
use crate::runtime::RuntimeBackend;

pub struct LeastConnSelector {
    weights: Box<[u64]>,
}

impl Selection for LeastConnSelector {
    fn build(backend: &RuntimeBackend, _: Worker) -> Self {
        LeastConnSelector {
            weights: backend.endpoints.iter().map(|e| u64::from(e.weight)).collect(),
        }
    }

    fn pick(&self, _: &Attempt<'_>, endpoints: &impl Endpoints, accept: impl Accept) -> Option<Pick> {
        crate::least_conn::pick(
            self.weights.len(),
            accept,
            |i| endpoints.connections(i),
            |i| self.weights[i],
            |k| fastrand::usize(..k),
        )
        .map(Pick::of)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn fewest_connections_per_weight_win() {
        let selector = Selector::build(&backend(Algorithm::LeastConn, &[1, 4, 1]), WORKER);
        let mut table = Table::healthy(3);
        table.conns = vec![2, 4, 3];
        // 4 connections at weight 4 is the least load.
        assert_eq!(first(&selector, &table, &TriedSet::new()), 1);
        let mut tried = TriedSet::new();
        tried.insert(1);
        assert_eq!(first(&selector, &table, &tried), 0);
        table.down[0] = true;
        assert_eq!(first(&selector, &table, &tried), 2);
    }
}
