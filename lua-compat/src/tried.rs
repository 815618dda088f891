//! The set of endpoints already tried by one request.
//!
//! A retry (`proxy_next_upstream`) must not pick an endpoint twice while
//! untried ones remain. Most backends have few endpoints, so the first 64 live
//! in one inline word and only larger backends allocate. The set is small
//! (three words) because it is allocated per request in nginx's request pool.

/// A bit set over endpoint indexes.
#[derive(Clone, Debug, Default)]
pub struct TriedSet {
    /// Endpoints 0..64.
    low: u64,
    /// Endpoints 64.., allocated on first use.
    high: Option<Box<[u64]>>,
}

impl TriedSet {
    pub fn new() -> Self {
        TriedSet::default()
    }

    /// Adds `i`; adding it twice is harmless.
    #[inline]
    pub fn insert(&mut self, i: usize) {
        if i < 64 {
            self.low |= 1 << i;
            return;
        }
        let word = (i - 64) / 64;
        let high = self.high.get_or_insert_with(Default::default);
        if word >= high.len() {
            let mut grown = vec![0; word + 1];
            grown[..high.len()].copy_from_slice(high);
            *high = grown.into();
        }
        high[word] |= 1 << ((i - 64) % 64);
    }

    #[inline]
    pub fn contains(&self, i: usize) -> bool {
        if i < 64 {
            return self.low & (1 << i) != 0;
        }
        let (word, bit) = ((i - 64) / 64, (i - 64) % 64);
        self.high
            .as_ref()
            .and_then(|h| h.get(word))
            .is_some_and(|w| w & (1 << bit) != 0)
    }

    pub fn len(&self) -> usize {
        let high: u32 = self.high.iter().flat_map(|h| h.iter()).map(|w| w.count_ones()).sum();
        (self.low.count_ones() + high) as usize
    }

    /// Cheaper than `len() == 0`: no population count.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.low == 0 && self.high.as_ref().is_none_or(|h| h.iter().all(|w| *w == 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stays_three_words() {
        assert!(std::mem::size_of::<TriedSet>() <= 3 * std::mem::size_of::<usize>());
    }

    proptest! {
        #[test]
        fn behaves_like_a_set(picks in proptest::collection::vec(0usize..400, 0..60)) {
            let mut set = TriedSet::new();
            let mut model = std::collections::BTreeSet::new();
            for p in picks {
                set.insert(p);
                model.insert(p);
            }
            prop_assert_eq!(set.len(), model.len());
            for i in 0..400 {
                prop_assert_eq!(set.contains(i), model.contains(&i));
            }
        }
    }
}
