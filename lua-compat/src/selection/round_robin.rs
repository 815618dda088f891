//! round_robin: nginx's smooth weighted round-robin, per worker (see
//! [`crate::round_robin`]).

use std::cell::RefCell;

use super::{Accept, Attempt, Endpoints, Pick, Selection, Worker};
use crate::round_robin::RoundRobin;
use crate::runtime::RuntimeBackend;

pub struct RoundRobinSelector {
    /// Each worker turns its own wheel, as each nginx worker does.
    wheel: RefCell<RoundRobin>,
}

impl Selection for RoundRobinSelector {
    fn build(backend: &RuntimeBackend, worker: Worker) -> Self {
        RoundRobinSelector {
            wheel: RefCell::new(RoundRobin::new(
                backend.endpoints.iter().map(|e| e.weight),
                worker.seed(),
            )),
        }
    }

    #[inline]
    fn pick(&self, _: &Attempt<'_>, _: &impl Endpoints, accept: impl Accept) -> Option<Pick> {
        self.wheel.borrow_mut().pick_accepted(accept).map(Pick::of)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn weights_hold_and_down_endpoints_are_skipped() {
        let selector = Selector::build(&backend(Algorithm::RoundRobin, &[3, 1, 1]), WORKER);
        let mut table = Table::healthy(3);
        assert_eq!(tally(&selector, &table, 50), [30, 10, 10]);
        table.down[0] = true;
        assert_eq!(tally(&selector, &table, 20), [0, 10, 10]);
    }
}
