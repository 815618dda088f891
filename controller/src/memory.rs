//! The allocator, for a process whose working set is built in bursts: a
//! model of 10,000 Ingresses, an nginx.conf of 11 MB, then quiet until the
//! next change.
//!
//! With glibc's malloc the controller held 270 MB at 10,000 Ingresses, of
//! which only 60-80 MB were live: the YAML trees, the rendered text and
//! the request bodies of a full push are freed between long-lived small
//! objects of the model, on several threads' arenas, and neither
//! `M_ARENA_MAX` nor `malloc_trim` gave the pages back. mimalloc (its
//! free-page segments and eager purge) keeps RSS near the live set; after
//! each burst [`release_free_memory`] asks it to purge at once rather than
//! after its delay. Figures: docs/src/install/kubernetes.md, "Scale and resources".
//!
//! Two settings keep the peak of a burst down (10,000 Ingresses, a new
//! host: a full model next to the previous one, and a render): freed pages
//! are purged at once ([`configure`]; 235 -> 223 MB), and the process runs
//! mimalloc is built with the sys crate's `no_thp` feature, so that it
//! neither asks for transparent huge pages nor lays its arenas out for them
//! (223 -> 196 MB, reproducibly; with the kernel's THP set to `always` a
//! 2 MB page stays resident while any of it is live). Boxing the rarely
//! used parts of a location (1.5 -> 1 KB each) looked like it would help
//! and did not: the peak rose to 243-250 MB (with or without also turning
//! THP off for the process with `prctl(PR_SET_THP_DISABLE)`), so it is not
//! done; the allocator's size classes matter more here than the bytes.

/// `mi_option_purge_delay` in mimalloc.h's `mi_option_t` (v2 and v3; the
/// sys crate names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Purges freed pages at once instead of after mimalloc's delay (1 s in
/// the v3 the sys crate builds, times 10 for arenas). A full build, a render and a full push each free tens of
/// megabytes on several threads, and with the delay a new host at 10,000
/// Ingresses peaked at 235 MB of RSS against 217 without it; the endpoint
/// path allocates little, so the extra `madvise` calls cost nothing
/// measurable there. Call before the runtime starts its threads.
pub fn configure() {
    // SAFETY: mi_option_set(3) takes an option number and a value, no
    // pointers; an option number it does not know is ignored.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
}

/// Returns freed memory to the kernel now (after a model build, a reload
/// or a full push).
pub fn release_free_memory() {
    // SAFETY: mi_collect(3) takes a flag and no pointers; it is
    // thread-safe and only affects mimalloc's own free lists.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option number still means the purge delay: its default is
    /// mimalloc v3's 1,000 ms, and what `configure` sets is what it reads.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        // SAFETY: mi_option_get/set take an option number and a value.
        let default = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(default, 1000, "mimalloc's option 15 is no longer purge_delay");
        configure();
        // SAFETY: as above, an option number in and a value out, no pointers.
        let set = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(set, 0);
    }
}
