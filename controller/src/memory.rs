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

/// Returns freed memory to the kernel now (after a model build, a reload
/// or a full push).
pub fn release_free_memory() {
    // SAFETY: mi_collect(3) takes a flag and no pointers; it is
    // thread-safe and only affects mimalloc's own free lists.
    unsafe { libmimalloc_sys::mi_collect(true) };
}
