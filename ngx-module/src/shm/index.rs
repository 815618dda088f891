//! What the zone holds, as every reader sees it: one immutable blob per
//! backend and a sorted index of them. [`crate::shm::store`] writes both;
//! workers, the API and the DNS refresher read them under the zone's lock.
//! A blob referenced by a published index is never changed or freed while
//! that index is current, which is what makes the reads below sound.

use std::ptr::{self, NonNull};
use std::slice;

use lua_compat::runtime::Prepared;

/// Header of a backend blob; name, JSON and runtime bytes follow it.
#[repr(C)]
pub struct Blob {
    /// The generation that wrote this blob.
    pub version: u64,
    pub(crate) alloc_size: usize,
    pub(crate) name_len: u32,
    pub(crate) json_len: u32,
    pub(crate) runtime_len: u32,
    pub endpoints: u32,
    /// Some endpoint is a DNS name, re-resolved periodically.
    pub resolves: bool,
}

impl Blob {
    fn tail(&self) -> &[u8] {
        let len = self.name_len as usize + self.json_len as usize + self.runtime_len as usize;
        // SAFETY: the blob was allocated with its three byte strings right after
        // the header and is immutable while an index references it.
        unsafe { slice::from_raw_parts((self as *const Blob).add(1).cast::<u8>(), len) }
    }

    pub fn name(&self) -> &[u8] {
        &self.tail()[..self.name_len as usize]
    }

    pub fn json(&self) -> &[u8] {
        let start = self.name_len as usize;
        &self.tail()[start..start + self.json_len as usize]
    }

    pub fn runtime(&self) -> &[u8] {
        &self.tail()[(self.name_len + self.json_len) as usize..]
    }

    pub(crate) fn same_content(&self, p: &Prepared) -> bool {
        self.json() == p.json.as_slice() && self.runtime() == p.runtime.as_slice()
    }
}

/// Blob pointers sorted by name.
#[repr(C)]
pub struct Index {
    pub(crate) entries: *mut NonNull<Blob>,
    pub(crate) len: usize,
}

impl Index {
    pub const fn empty() -> Index {
        Index {
            entries: ptr::null_mut(),
            len: 0,
        }
    }

    pub fn blobs(&self) -> impl ExactSizeIterator<Item = &Blob> + '_ {
        self.slice().iter().map(|b| {
            // SAFETY: blobs referenced by a live index are valid (see module doc).
            unsafe { b.as_ref() }
        })
    }

    pub fn find(&self, name: &[u8]) -> Option<&Blob> {
        let i = self.position(name).ok()?;
        // SAFETY: a blob referenced by the live index `self` is valid and
        // immutable while `self` is borrowed (see module doc).
        Some(unsafe { self.slice()[i].as_ref() })
    }

    pub(crate) fn slice(&self) -> &[NonNull<Blob>] {
        if self.entries.is_null() {
            &[]
        } else {
            // SAFETY: entries/len describe an array the writer allocated.
            unsafe { slice::from_raw_parts(self.entries, self.len) }
        }
    }

    pub(crate) fn position(&self, name: &[u8]) -> Result<usize, usize> {
        self.slice().binary_search_by(|b| {
            // SAFETY: a blob referenced by the live index `self` is valid and
            // immutable while `self` is borrowed (see module doc).
            unsafe { b.as_ref() }.name().cmp(name)
        })
    }
}
