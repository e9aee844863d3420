//! A fixed-capacity burst of owned mbufs: what rx_burst fills and tx_burst
//! drains. Mbufs left in a batch are freed when it drops, so nothing leaks.

use std::ptr::{self, NonNull};

use crate::mbuf::Mbuf;
use crate::sys;

pub struct MbufBatch<const N: usize> {
    // Slots [0, len) hold owned, valid mbufs; the rest are unused.
    ptrs: [*mut sys::rte_mbuf; N],
    len: usize,
}

// SAFETY: the batch owns its mbufs exclusively (see Mbuf's Send).
unsafe impl<const N: usize> Send for MbufBatch<N> {}

impl<const N: usize> Default for MbufBatch<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> MbufBatch<N> {
    pub const fn new() -> Self {
        MbufBatch {
            ptrs: [ptr::null_mut(); N],
            len: 0,
        }
    }

    pub const fn capacity(&self) -> usize {
        N
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn is_full(&self) -> bool {
        self.len == N
    }

    /// Free slots.
    pub fn spare(&self) -> usize {
        N - self.len
    }

    /// Add an mbuf; gives it back if the batch is full.
    pub fn push(&mut self, m: Mbuf) -> Result<(), Mbuf> {
        if self.is_full() {
            return Err(m);
        }
        self.ptrs[self.len] = m.into_raw().as_ptr();
        self.len += 1;
        Ok(())
    }

    pub fn pop(&mut self) -> Option<Mbuf> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY: slot len was owned and is now out of the batch.
        Some(unsafe { Mbuf::from_raw(NonNull::new_unchecked(self.ptrs[self.len])) })
    }

    pub fn as_slice(&self) -> &[Mbuf] {
        // SAFETY: Mbuf is repr(transparent) over a non-null pointer and the
        // first len slots hold valid, owned, non-null mbuf pointers.
        unsafe { std::slice::from_raw_parts(self.ptrs.as_ptr() as *const Mbuf, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [Mbuf] {
        // SAFETY: as in as_slice; &mut self makes access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptrs.as_mut_ptr() as *mut Mbuf, self.len) }
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Mbuf> {
        self.as_slice().iter()
    }

    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Mbuf> {
        self.as_mut_slice().iter_mut()
    }

    /// Free every mbuf in the batch.
    pub fn clear(&mut self) {
        self.free_from(0);
    }

    /// Take every mbuf out, first to last; the batch is empty afterwards
    /// (mbufs the iterator did not yield when dropped are freed).
    pub fn drain(&mut self) -> Drain<'_, N> {
        // The batch gives up its slots now, so forgetting the iterator
        // leaks mbufs rather than freeing handed-out ones twice.
        let end = std::mem::replace(&mut self.len, 0);
        Drain {
            batch: self,
            next: 0,
            end,
        }
    }

    /// Keep the first `n` mbufs and free the rest.
    pub fn truncate(&mut self, n: usize) {
        if n < self.len {
            self.free_from(n);
        }
    }

    fn free_from(&mut self, start: usize) {
        if start >= self.len {
            return;
        }
        // SAFETY: slots [start, len) hold owned mbufs; after the call they
        // are out of the batch.
        unsafe {
            sys::rte_pktmbuf_free_bulk(self.ptrs.as_mut_ptr().add(start), (self.len - start) as u32)
        };
        self.len = start;
    }

    /// Remove the first `n` mbufs (handed to DPDK, e.g. sent), moving the
    /// rest to the front.
    pub(crate) fn consume_front(&mut self, n: usize) {
        debug_assert!(n <= self.len);
        if n < self.len {
            self.ptrs.copy_within(n..self.len, 0);
        }
        self.len -= n;
    }

    /// Pointer to the first mbuf, for bursts out of the batch.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut *mut sys::rte_mbuf {
        self.ptrs.as_mut_ptr()
    }

    /// Pointer to the first free slot, for bursts into the batch.
    pub(crate) fn spare_ptr(&mut self) -> *mut *mut sys::rte_mbuf {
        // SAFETY: len <= N, so the pointer is in bounds or one past the end.
        unsafe { self.ptrs.as_mut_ptr().add(self.len) }
    }

    /// Declare that `n` free slots were filled with owned mbufs.
    ///
    /// # Safety
    /// Slots [len, len + n) must now hold valid mbufs owned by nobody else.
    pub(crate) unsafe fn commit(&mut self, n: usize) {
        debug_assert!(self.len + n <= N);
        self.len += n;
    }
}

/// In-order owning iterator over a batch; see `MbufBatch::drain`.
pub struct Drain<'a, const N: usize> {
    batch: &'a mut MbufBatch<N>,
    next: usize,
    end: usize,
}

impl<const N: usize> Iterator for Drain<'_, N> {
    type Item = Mbuf;

    fn next(&mut self) -> Option<Mbuf> {
        if self.next >= self.end {
            return None;
        }
        let raw = self.batch.ptrs[self.next];
        self.next += 1;
        // SAFETY: slots [next, end) hold owned mbufs that the batch no longer
        // claims; each is handed out once (Drop below frees only the rest).
        Some(unsafe { Mbuf::from_raw(NonNull::new_unchecked(raw)) })
    }
}

impl<const N: usize> Drop for Drain<'_, N> {
    fn drop(&mut self) {
        if self.next < self.end {
            // SAFETY: slots [next, end) hold owned mbufs nobody else has.
            unsafe {
                sys::rte_pktmbuf_free_bulk(
                    self.batch.ptrs.as_mut_ptr().add(self.next),
                    (self.end - self.next) as u32,
                )
            };
        }
    }
}

impl<const N: usize> Drop for MbufBatch<N> {
    fn drop(&mut self) {
        self.clear();
    }
}
