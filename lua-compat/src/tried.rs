//! The set of endpoints already tried by one request.
//!
//! A retry (`proxy_next_upstream`) must not pick an endpoint twice while
//! untried ones remain. Most backends have few endpoints, so the set lives in
//! one machine word and allocates only for large backends.

/// A bit set over endpoint indexes.
#[derive(Clone, Debug)]
pub enum TriedSet {
    /// Up to 128 endpoints; two words keep the alignment at 8 so the set can
    /// live in nginx pool memory.
    Small([u64; 2]),
    Large(Vec<u64>),
}

impl TriedSet {
    pub fn new(endpoints: usize) -> Self {
        if endpoints <= 128 {
            TriedSet::Small([0; 2])
        } else {
            TriedSet::Large(vec![0; endpoints.div_ceil(64)])
        }
    }

    pub fn insert(&mut self, i: usize) {
        match self {
            TriedSet::Small(words) => words[i / 64] |= 1u64 << (i % 64),
            TriedSet::Large(words) => words[i / 64] |= 1u64 << (i % 64),
        }
    }

    pub fn contains(&self, i: usize) -> bool {
        match self {
            TriedSet::Small(words) => i < 128 && words[i / 64] & (1u64 << (i % 64)) != 0,
            TriedSet::Large(words) => words
                .get(i / 64)
                .is_some_and(|w| w & (1u64 << (i % 64)) != 0),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            TriedSet::Small(words) => words.iter().map(|w| w.count_ones() as usize).sum(),
            TriedSet::Large(words) => words.iter().map(|w| w.count_ones() as usize).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn behaves_like_a_set(n in 1usize..400, picks in proptest::collection::vec(0usize..400, 0..50)) {
            let mut set = TriedSet::new(n);
            let mut model = std::collections::BTreeSet::new();
            for p in picks.into_iter().filter(|p| *p < n) {
                set.insert(p);
                model.insert(p);
            }
            prop_assert_eq!(set.len(), model.len());
            for i in 0..n {
                prop_assert_eq!(set.contains(i), model.contains(&i));
            }
        }
    }
}
