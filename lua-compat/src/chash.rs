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

use crc32fast::Hasher;

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
    pub fn new<'a>(nodes: impl IntoIterator<Item = (&'a str, u32)>) -> ChashRing {
        let mut points = Vec::new();
        for (index, (id, weight)) in nodes.into_iter().enumerate() {
            let base = crc32(id.as_bytes());
            let mut prev: u32 = 0;
            for _ in 0..weight * POINTS_PER_WEIGHT {
                let mut h = Hasher::new_with_initial(base);
                h.update(&prev.to_le_bytes());
                prev = h.finalize();
                points.push((prev, index as u32));
            }
        }
        // Stable: equal hashes keep node order.
        points.sort_by_key(|p| p.0);
        ChashRing { points: points.into() }
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

    #[test]
    fn weight_adds_points() {
        let ring = ChashRing::new([("a:1", 1), ("b:1", 3)]);
        assert_eq!(ring.points.len(), 4 * POINTS_PER_WEIGHT as usize);
    }
}
