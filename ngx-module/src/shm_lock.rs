//! A reader-writer lock for shared memory, on nginx's own `ngx_rwlock_*`.
//!
//! nginx's rwlock spins briefly with a doubling backoff, then calls
//! `sched_yield`. That matters here: the writer may be a low-priority thread,
//! and a reader on an event loop must yield to it rather than spin for long
//! while it is preempted. (The `ngx` crate's lock spins far longer before
//! yielding.) The lock word and the value sit side by side in the zone.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};

use ngx::ffi::{ngx_atomic_t, ngx_rwlock_rlock, ngx_rwlock_unlock, ngx_rwlock_wlock};

#[repr(C)]
pub struct ShmRwLock<T> {
    lock: UnsafeCell<ngx_atomic_t>,
    value: UnsafeCell<T>,
}

impl<T> ShmRwLock<T> {
    pub const fn new(value: T) -> Self {
        ShmRwLock {
            lock: UnsafeCell::new(0),
            value: UnsafeCell::new(value),
        }
    }

    pub fn read(&self) -> ReadGuard<'_, T> {
        // SAFETY: the lock word lives as long as self and is only touched
        // through ngx_rwlock_*, which are atomic across processes and threads.
        unsafe { ngx_rwlock_rlock(self.lock.get()) };
        ReadGuard(self)
    }

    pub fn write(&self) -> WriteGuard<'_, T> {
        // SAFETY: as in read().
        unsafe { ngx_rwlock_wlock(self.lock.get()) };
        WriteGuard(self)
    }

    /// The value without locking, for the one writer that already excludes
    /// every other writer by other means (see `store::apply`).
    pub fn data_ptr(&self) -> *mut T {
        self.value.get()
    }
}

pub struct ReadGuard<'a, T>(&'a ShmRwLock<T>);

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: shared access under the read lock.
        unsafe { &*self.0.value.get() }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: we hold the read lock.
        unsafe { ngx_rwlock_unlock(self.0.lock.get()) };
    }
}

pub struct WriteGuard<'a, T>(&'a ShmRwLock<T>);

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: exclusive access under the write lock.
        unsafe { &*self.0.value.get() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: exclusive access under the write lock.
        unsafe { &mut *self.0.value.get() }
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: we hold the write lock.
        unsafe { ngx_rwlock_unlock(self.0.lock.get()) };
    }
}
