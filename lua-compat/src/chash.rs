//! Consistent hashing that makes exactly the choices of lua-resty-balancer's
//! `resty.chash` (v0.05), which ingress-nginx uses for `upstream-hash-by` and
//! for balanced sticky sessions.
//!
//! Each node (`address:port`, IPv6 bracketed) gets 160 points per unit of
//! weight. The points chain off the CRC32 of the node id: point `i` is the CRC32
//! of the id followed by the four little-endian bytes of point `i - 1` (zero for
//! the first). A key maps to the first point whose hash is not below the
//! key's CRC32, wrapping to the first point of the ring.
//!
//! Only points with equal hashes could order differently from the Lua (its
//! ties depend on Lua table iteration); with 32-bit hashes that is a
//! one-in-billions event per pair of points.

/// Points per unit of node weight, as `CONSISTENT_POINTS` in resty.chash.
pub const POINTS_PER_WEIGHT: u32 = 160;

/// A hash ring over nodes identified by index.
#[derive(Clone, Debug)]
pub struct ChashRing {
    /// (hash, node index), sorted by hash then by insertion order.
    points: Box<[(u32, u32)]>,
}

impl ChashRing {
    /// Builds the ring over `(id, weight)` nodes; a node's index is its
    /// position in `nodes`. Weight 0 nodes get no points.
    ///
    /// Each worker builds the rings of the backends it routes when they
    /// change, so this is on a request's path: 10,000 endpoints make 1.6 M
    /// points. The chained CRC step is done with a slice-by-4 table (each
    /// step hashes exactly four bytes) and the points are ordered by a stable
    /// two-pass radix sort, about four times faster than `crc32fast` per
    /// point plus a comparison sort.
    pub fn new<'a>(nodes: impl IntoIterator<Item = (&'a str, u32)>) -> ChashRing {
        let tables = crc_tables();
        let nodes: Vec<(&str, u32)> = nodes.into_iter().collect();
        let total: usize = nodes.iter().map(|n| (n.1 * POINTS_PER_WEIGHT) as usize).sum();
        let mut points = Vec::with_capacity(total);
        for (index, (id, weight)) in nodes.into_iter().enumerate() {
            let base = crc32(id.as_bytes());
            let mut prev: u32 = 0;
            for _ in 0..weight * POINTS_PER_WEIGHT {
                prev = crc32_extend4(tables, base, prev);
                points.push((prev, index as u32));
            }
        }
        ChashRing {
            points: radix_sort_by_hash(points).into(),
        }
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The node index `key` maps to, and its position on the ring.
    pub fn find(&self, key: &[u8]) -> Option<(usize, usize)> {
        if self.points.is_empty() {
            return None;
        }
        let hash = crc32(key);
        let pos = self.points.partition_point(|p| p.0 < hash);
        let pos = if pos == self.points.len() { 0 } else { pos };
        Some((self.points[pos].1 as usize, pos))
    }

    /// The node at the ring position after `pos` (resty.chash `next`), used
    /// to walk on when a node must be skipped.
    pub fn next(&self, pos: usize) -> (usize, usize) {
        let pos = (pos + 1) % self.points.len();
        (self.points[pos].1 as usize, pos)
    }

    /// The first node at or after `key`'s position that `usable` accepts,
    /// walking the ring; `None` if no node is usable.
    pub fn find_usable(&self, key: &[u8], nodes: usize, usable: impl Fn(usize) -> bool) -> Option<usize> {
        let (mut node, mut pos) = self.find(key)?;
        // The common case, in O(log n): the key's own node is usable. Only a
        // walk (retries, ejected endpoints) tracks which nodes it has seen.
        if usable(node) {
            return Some(node);
        }
        let mut seen = vec![false; nodes];
        let mut distinct = 0;
        for _ in 0..self.points.len() {
            if usable(node) {
                return Some(node);
            }
            if !seen[node] {
                seen[node] = true;
                distinct += 1;
                if distinct == nodes {
                    return None;
                }
            }
            (node, pos) = self.next(pos);
        }
        None
    }
}

/// CRC32 as nginx's `ngx_crc32_short` (IEEE, the zlib polynomial).
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// The slice-by-4 tables of the reflected IEEE polynomial.
type CrcTables = [[u32; 256]; 4];

fn crc_tables() -> &'static CrcTables {
    static TABLES: std::sync::OnceLock<Box<CrcTables>> = std::sync::OnceLock::new();
    TABLES.get_or_init(|| {
        let mut t = Box::new([[0u32; 256]; 4]);
        for i in 0..256u32 {
            let mut c = i;
            for _ in 0..8 {
                c = if c & 1 != 0 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
            }
            t[0][i as usize] = c;
        }
        for i in 0..256 {
            for k in 1..4 {
                let prev = t[k - 1][i];
                t[k][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            }
        }
        t
    })
}

/// The CRC32 of data whose CRC32 is `crc`, followed by `word`'s four
/// little-endian bytes: `crc32fast::Hasher::new_with_initial(crc)` updated
/// with them, in one table step.
fn crc32_extend4(t: &CrcTables, crc: u32, word: u32) -> u32 {
    let c = !crc ^ word;
    !(t[3][(c & 0xff) as usize]
        ^ t[2][((c >> 8) & 0xff) as usize]
        ^ t[1][((c >> 16) & 0xff) as usize]
        ^ t[0][(c >> 24) as usize])
}

/// `points` ordered by hash, equal hashes in their original order (a
/// least-significant-digit radix sort is stable).
fn radix_sort_by_hash(points: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    if points.len() < 256 {
        let mut points = points;
        points.sort_by_key(|p| p.0);
        return points;
    }
    // Three 11-bit digits: 2,048 buckets keep every pass's write positions
    // in cache, where 16-bit digits scatter over 65,536 and thrash it.
    const BITS: u32 = 11;
    const MASK: u32 = (1 << BITS) - 1;
    let mut counts = [[0usize; 1 << BITS]; 3];
    for p in &points {
        for (d, c) in counts.iter_mut().enumerate() {
            c[((p.0 >> (BITS * d as u32)) & MASK) as usize] += 1;
        }
    }
    let mut src = points;
    let mut dst = vec![(0u32, 0u32); src.len()];
    for (d, offsets) in counts.iter_mut().enumerate() {
        let shift = BITS * d as u32;
        let mut total = 0;
        for o in offsets.iter_mut() {
            let count = *o;
            *o = total;
            total += count;
        }
        for p in &src {
            let digit = ((p.0 >> shift) & MASK) as usize;
            dst[offsets[digit]] = *p;
            offsets[digit] += 1;
        }
        std::mem::swap(&mut src, &mut dst);
    }
    src
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_the_ring_to_a_usable_node() {
        let ids = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"];
        let ring = ChashRing::new(ids.iter().map(|i| (*i, 1)));
        let (first, _) = ring.find(b"some-key").unwrap();
        let other = ring.find_usable(b"some-key", 3, |n| n != first).unwrap();
        assert_ne!(other, first);
        assert_eq!(ring.find_usable(b"some-key", 3, |_| false), None);
        assert_eq!(ChashRing::new(std::iter::empty()).find(b"k"), None);
    }

    /// The ring as first written: `crc32fast` per point, a stable sort.
    fn reference_points(nodes: &[(&str, u32)]) -> Vec<(u32, u32)> {
        let mut points = Vec::new();
        for (index, (id, weight)) in nodes.iter().enumerate() {
            let base = crc32(id.as_bytes());
            let mut prev: u32 = 0;
            for _ in 0..weight * POINTS_PER_WEIGHT {
                let mut h = crc32fast::Hasher::new_with_initial(base);
                h.update(&prev.to_le_bytes());
                prev = h.finalize();
                points.push((prev, index as u32));
            }
        }
        points.sort_by_key(|p| p.0);
        points
    }

    #[test]
    fn the_fast_build_makes_the_reference_ring() {
        let ids: Vec<String> = (0..300).map(|i| format!("10.0.{}.{}:80", i / 256, i % 256)).collect();
        let nodes: Vec<(&str, u32)> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.as_str(), 1 + (i % 3) as u32))
            .collect();
        let ring = ChashRing::new(nodes.iter().copied());
        assert_eq!(&*ring.points, &reference_points(&nodes)[..]);
        // Below the radix sort's threshold too.
        let ring = ChashRing::new([("a:1", 1)]);
        assert_eq!(&*ring.points, &reference_points(&[("a:1", 1)])[..]);
    }

    proptest::proptest! {
        #[test]
        fn the_radix_sort_is_a_stable_sort(hashes in proptest::collection::vec(0u32..1024, 0..2000)) {
            let points: Vec<(u32, u32)> = hashes.iter().enumerate().map(|(i, h)| (*h, i as u32)).collect();
            let mut expected = points.clone();
            expected.sort_by_key(|p| p.0);
            proptest::prop_assert_eq!(radix_sort_by_hash(points), expected);
        }

        #[test]
        fn the_table_step_is_crc32_of_four_more_bytes(crc: u32, word: u32) {
            let mut h = crc32fast::Hasher::new_with_initial(crc);
            h.update(&word.to_le_bytes());
            proptest::prop_assert_eq!(crc32_extend4(crc_tables(), crc, word), h.finalize());
        }
    }

    #[test]
    fn weight_adds_points() {
        let ring = ChashRing::new([("a:1", 1), ("b:1", 3)]);
        assert_eq!(ring.points.len(), 4 * POINTS_PER_WEIGHT as usize);
    }
}
