//! ewma: the lower decayed round-trip score of two random endpoints (see
//! [`crate::ewma`]); the scores are shared by all workers.

use super::{Accept, Attempt, Endpoints, Pick, Selection, Worker};
use crate::runtime::RuntimeBackend;

pub struct EwmaSelector {
    endpoints: usize,
}

impl Selection for EwmaSelector {
    fn build(backend: &RuntimeBackend, _: Worker) -> Self {
        EwmaSelector {
            endpoints: backend.endpoints.len(),
        }
    }

    fn pick(&self, _: &Attempt<'_>, endpoints: &impl Endpoints, accept: impl Accept) -> Option<Pick> {
        let score = |i: usize| endpoints.ewma_score(i);
        let (endpoint, score) = crate::ewma::pick_two(self.endpoints, accept, score, |k| fastrand::usize(..k))?;
        Some(Pick {
            endpoint,
            ewma_score: Some(score),
            new_cookie: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn the_faster_of_two_wins_and_its_score_is_reported() {
        let selector = Selector::build(&backend(Algorithm::Ewma, &[1, 1]), WORKER);
        let mut table = Table::healthy(2);
        table.scores = vec![0.5, 0.1];
        for _ in 0..20 {
            let pick = select(&selector, &Attempt::default(), &table, &TriedSet::new()).unwrap();
            assert_eq!((pick.endpoint, pick.ewma_score), (1, Some(0.1)));
        }
        let mut tried = TriedSet::new();
        tried.insert(1);
        let pick = select(&selector, &Attempt::default(), &table, &tried).unwrap();
        assert_eq!((pick.endpoint, pick.ewma_score), (0, Some(0.5)));
    }
}
