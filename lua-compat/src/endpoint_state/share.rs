//! Who keeps a slot when the zone has no room for more: each backend's
//! max-min fair share of the table.
//!
//! While the zone has room, every endpoint has a slot and nothing here
//! runs. When it has none, the table's slots are divided among backends as
//! max-min fairness divides a link: a backend with fewer endpoints than the
//! level gets a slot for each, and the others share the rest equally. An
//! endpoint of a backend below its share takes a free slot, or else the
//! slot of an endpoint of the backend furthest above its share, idle ones
//! (no open connection, no failure counted) first. A backend at or below
//! its share never gives a slot up, so one tenant's thousands of endpoints
//! cannot take the room of another tenant's few, whatever arrived first.
//!
//! The unit is the backend (a Service port), the unit the module knows. A
//! tenant with many Services holds many shares, but each of its Services
//! is limited to the same level as everyone else's.

use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;

/// What the table holds for an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    Untracked,
    /// Tracked, with no open connection and no failure counted.
    Idle,
    Busy,
}

/// The changes that bring every backend to its share, as far as evictions
/// allow: free these slots, then give slots to those endpoints.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub evict: Vec<SocketAddr>,
    pub track: Vec<SocketAddr>,
}

/// The max-min fair level for `demand` over `capacity`: every backend
/// gets `min(demand, level)`. `None` when every demand fits.
pub fn level(demand: &[u64], capacity: u64) -> Option<u64> {
    let mut d = demand.to_vec();
    d.sort_unstable();
    let mut left = capacity;
    for (i, x) in d.iter().enumerate() {
        let rest = (d.len() - i) as u64;
        if x.saturating_mul(rest) <= left {
            left -= x;
        } else {
            return Some(left / rest);
        }
    }
    None
}

/// Plans the slots of a table of `capacity` slots for `backends` (each
/// backend's distinct endpoint addresses, in order), given what the table
/// holds now.
pub fn plan(backends: &[Vec<SocketAddr>], capacity: u64, held: impl Fn(&SocketAddr) -> Held) -> Plan {
    let mut state: HashMap<SocketAddr, Held> = HashMap::new();
    let mut owners: HashMap<SocketAddr, Vec<usize>> = HashMap::new();
    for (b, addrs) in backends.iter().enumerate() {
        for a in addrs {
            state.entry(*a).or_insert_with(|| held(a));
            owners.entry(*a).or_default().push(b);
        }
    }
    let demand: Vec<u64> = backends.iter().map(|a| a.len() as u64).collect();
    let Some(level) = level(&demand, capacity) else {
        // Everyone fits: what is untracked only waits for free slots.
        return Plan::default();
    };
    // Above (> 0) or below (< 0) its share, per backend.
    let mut surplus: Vec<i64> = backends
        .iter()
        .map(|addrs| {
            let tracked = addrs.iter().filter(|a| state[*a] != Held::Untracked).count() as i64;
            tracked - addrs.len().min(level as usize) as i64
        })
        .collect();
    let live = state.values().filter(|h| **h != Held::Untracked).count() as u64;
    let mut free = capacity.saturating_sub(live);

    // The furthest below their share first.
    let mut needy: Vec<usize> = (0..backends.len()).filter(|b| surplus[*b] < 0).collect();
    needy.sort_by_key(|b| (surplus[*b], *b));
    let mut donors: BinaryHeap<(i64, usize)> = (0..backends.len())
        .filter(|b| surplus[*b] > 0)
        .map(|b| (surplus[b], b))
        .collect();
    let mut candidates: HashMap<usize, Vec<SocketAddr>> = HashMap::new();
    let mut plan = Plan::default();

    'needy: for b in needy {
        for a in &backends[b] {
            if surplus[b] >= 0 {
                break;
            }
            if state[a] != Held::Untracked {
                continue;
            }
            if free > 0 {
                free -= 1;
            } else {
                let Some(victim) = take_victim(&mut donors, &mut surplus, &mut candidates, backends, &state, &owners)
                else {
                    break 'needy;
                };
                state.insert(victim, Held::Untracked);
                plan.evict.push(victim);
            }
            state.insert(*a, Held::Busy);
            for o in &owners[a] {
                surplus[*o] += 1;
            }
            plan.track.push(*a);
        }
    }
    plan
}

/// An endpoint to give up: of the backend furthest above its share, idle
/// first, last listed first, and only if every backend listing it is above
/// its share too. Updates the surpluses.
fn take_victim(
    donors: &mut BinaryHeap<(i64, usize)>,
    surplus: &mut [i64],
    candidates: &mut HashMap<usize, Vec<SocketAddr>>,
    backends: &[Vec<SocketAddr>],
    state: &HashMap<SocketAddr, Held>,
    owners: &HashMap<SocketAddr, Vec<usize>>,
) -> Option<SocketAddr> {
    while let Some((s, d)) = donors.pop() {
        if s != surplus[d] {
            // Stale entry: its surplus moved since it was pushed.
            if surplus[d] > 0 {
                donors.push((surplus[d], d));
            }
            continue;
        }
        let list = candidates.entry(d).or_insert_with(|| {
            // Popped from the end: busy ones first in the list, idle last;
            // within each, in list order, so the last listed goes first.
            let tracked = backends[d].iter().filter(|a| state[*a] != Held::Untracked);
            let (idle, busy): (Vec<SocketAddr>, Vec<SocketAddr>) = tracked.partition(|a| state[*a] == Held::Idle);
            busy.into_iter().chain(idle).collect()
        });
        while let Some(a) = list.pop() {
            if state[&a] == Held::Untracked || owners[&a].iter().any(|o| surplus[*o] <= 0) {
                continue;
            }
            for o in &owners[&a] {
                surplus[*o] -= 1;
            }
            if surplus[d] > 0 {
                donors.push((surplus[d], d));
            }
            return Some(a);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn addrs(backend: u8, n: usize) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| SocketAddr::from(([10, backend, (i >> 8) as u8, i as u8], 80)))
            .collect()
    }

    #[test]
    fn the_level_is_max_min_fair() {
        assert_eq!(level(&[3, 400, 400], 10_000), None);
        assert_eq!(level(&[3, 400, 400], 403), Some(200));
        assert_eq!(level(&[3, 400, 400], 100), Some(48));
        assert_eq!(level(&[30, 30, 30], 30), Some(10));
        assert_eq!(level(&[], 0), None);
    }

    #[test]
    fn a_small_backend_takes_its_share_from_the_big_one() {
        // One tenant took all 100 slots; another's 3 endpoints arrive.
        let big = addrs(1, 300);
        let small = addrs(2, 3);
        let tracked: Vec<SocketAddr> = big[..100].to_vec();
        let held = |a: &SocketAddr| {
            if !tracked.contains(a) {
                Held::Untracked
            } else if a.ip().to_string().ends_with(".7") {
                Held::Busy
            } else {
                Held::Idle
            }
        };
        let p = plan(&[big.clone(), small.clone()], 100, held);
        assert_eq!(p.track, small);
        assert_eq!(p.evict.len(), 3);
        assert!(p.evict.iter().all(|a| tracked.contains(a) && held(a) == Held::Idle));
        assert_eq!(p.evict[0], big[99], "the last listed goes first");
    }

    #[test]
    fn a_backend_within_its_share_keeps_every_slot() {
        let (a, b) = (addrs(1, 10), addrs(2, 500));
        // `a` holds all of its 10, `b` 90 of 500; `b` wants more but `a`
        // is within its share (level 90).
        let held = |x: &SocketAddr| {
            if a.contains(x) || b[..90].contains(x) {
                Held::Idle
            } else {
                Held::Untracked
            }
        };
        assert_eq!(plan(&[a.clone(), b.clone()], 100, held), Plan::default());
    }

    proptest! {
        /// Whatever is tracked before, after the plan no backend is below
        /// its share while another is above it, and the table never holds
        /// more than its capacity.
        #[test]
        fn nobody_stays_below_share_while_another_is_above(
            sizes in proptest::collection::vec(1usize..60, 1..8),
            capacity in 1u64..200,
            seed in any::<u64>(),
        ) {
            let backends: Vec<Vec<SocketAddr>> = sizes.iter().enumerate().map(|(i, n)| addrs(i as u8, *n)).collect();
            // Fill greedily in an order the seed picks, up to capacity.
            let mut all: Vec<SocketAddr> = backends.concat();
            let mut rng = fastrand::Rng::with_seed(seed);
            rng.shuffle(&mut all);
            let before: Vec<SocketAddr> = all.into_iter().take(capacity as usize).collect();
            let p = plan(&backends, capacity, |a| if before.contains(a) { Held::Idle } else { Held::Untracked });
            let after: Vec<SocketAddr> = before
                .iter()
                .filter(|a| !p.evict.contains(a))
                .chain(p.track.iter())
                .copied()
                .collect();
            prop_assert!(after.len() as u64 <= capacity);
            let demand: Vec<u64> = sizes.iter().map(|n| *n as u64).collect();
            if let Some(level) = level(&demand, capacity) {
                let count = |b: &Vec<SocketAddr>| b.iter().filter(|a| after.contains(a)).count() as u64;
                let below = backends.iter().any(|b| count(b) < (b.len() as u64).min(level));
                let above = backends.iter().any(|b| count(b) > (b.len() as u64).min(level));
                prop_assert!(!(below && above), "{:?}", backends.iter().map(count).collect::<Vec<_>>());
            } else {
                prop_assert!(p.evict.is_empty());
            }
        }
    }
}
