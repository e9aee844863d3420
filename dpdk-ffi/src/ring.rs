//! rte_ring carrying mbufs between lcores. `Ring::spsc` gives one producer
//! and one consumer that cannot be cloned; `Ring::mpmc` gives handles that
//! can. Mbufs still queued when the ring goes away are freed.

use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::batch::MbufBatch;
use crate::eal::Eal;
use crate::error::{from_rte_errno, Error, Result};
use crate::sys;

/// Single producer, single consumer.
pub struct Spsc;
/// Multi producer, multi consumer.
pub struct Mpmc;

pub struct Producer<M> {
    ring: Arc<RingInner>,
    _mode: PhantomData<M>,
}

pub struct Consumer<M> {
    ring: Arc<RingInner>,
    _mode: PhantomData<M>,
}

struct RingInner {
    raw: NonNull<sys::rte_ring>,
    _eal: Eal,
}

// SAFETY: rte_ring is built for use from several threads; the
// single-producer/consumer rule is enforced by the handle types.
unsafe impl Send for RingInner {}
// SAFETY: as above.
unsafe impl Sync for RingInner {}

// SAFETY: the handle moves to another thread as a whole; there is one of each
// for Spsc (not Clone), so single-producer/consumer still holds.
unsafe impl<M> Send for Producer<M> {}
// SAFETY: as above.
unsafe impl<M> Send for Consumer<M> {}

pub struct Ring;

impl Ring {
    /// A ring for `capacity` mbufs (rounded up to a power of two, minus one).
    pub fn spsc(eal: &Eal, name: &str, capacity: u32) -> Result<(Producer<Spsc>, Consumer<Spsc>)> {
        let flags = sys::RING_F_SP_ENQ | sys::RING_F_SC_DEQ | sys::RING_F_EXACT_SZ;
        create(eal, name, capacity, flags)
    }

    pub fn mpmc(eal: &Eal, name: &str, capacity: u32) -> Result<(Producer<Mpmc>, Consumer<Mpmc>)> {
        create(eal, name, capacity, sys::RING_F_EXACT_SZ)
    }
}

fn create<M>(
    eal: &Eal,
    name: &str,
    capacity: u32,
    flags: u32,
) -> Result<(Producer<M>, Consumer<M>)> {
    let cname = CString::new(name)
        .map_err(|_| Error::InvalidArgument(format!("ring name {name:?} has a NUL")))?;
    // SAFETY: EAL is initialised; DPDK copies the name.
    let raw = unsafe { sys::rte_ring_create(cname.as_ptr(), capacity, sys::SOCKET_ID_ANY, flags) };
    let raw = NonNull::new(raw).ok_or_else(|| from_rte_errno("rte_ring_create"))?;
    let ring = Arc::new(RingInner {
        raw,
        _eal: eal.clone(),
    });
    Ok((
        Producer {
            ring: ring.clone(),
            _mode: PhantomData,
        },
        Consumer {
            ring,
            _mode: PhantomData,
        },
    ))
}

impl Clone for Producer<Mpmc> {
    fn clone(&self) -> Self {
        Producer {
            ring: self.ring.clone(),
            _mode: PhantomData,
        }
    }
}

impl Clone for Consumer<Mpmc> {
    fn clone(&self) -> Self {
        Consumer {
            ring: self.ring.clone(),
            _mode: PhantomData,
        }
    }
}

impl<M> Producer<M> {
    /// Move mbufs from the front of the batch into the ring; returns how
    /// many went. Those that did not fit stay in the batch.
    #[inline]
    pub fn enqueue_burst<const N: usize>(&mut self, batch: &mut MbufBatch<N>) -> usize {
        // SAFETY: the ring holds pointers; the first len slots are owned
        // mbufs, and the ring takes ownership of the first n.
        let n = unsafe {
            sys::ainftp_ring_enqueue_burst(
                self.ring.raw.as_ptr(),
                batch.as_mut_ptr() as *const *mut std::ffi::c_void,
                batch.len() as u32,
            )
        } as usize;
        batch.consume_front(n);
        n
    }

    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<M> Consumer<M> {
    /// Move mbufs from the ring into the batch's free slots.
    #[inline]
    pub fn dequeue_burst<const N: usize>(&mut self, batch: &mut MbufBatch<N>) -> usize {
        self.dequeue_burst_max(batch, N)
    }

    /// `dequeue_burst`, taking at most `max` mbufs.
    #[inline]
    pub fn dequeue_burst_max<const N: usize>(
        &mut self,
        batch: &mut MbufBatch<N>,
        max: usize,
    ) -> usize {
        let room = batch.spare().min(max);
        // SAFETY: only mbufs are ever enqueued; the batch has at least
        // `room` free slots and takes ownership of the n dequeued.
        unsafe {
            let n = sys::ainftp_ring_dequeue_burst(
                self.ring.raw.as_ptr(),
                batch.spare_ptr() as *mut *mut std::ffi::c_void,
                room as u32,
            ) as usize;
            batch.commit(n);
            n
        }
    }

    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl RingInner {
    fn len(&self) -> usize {
        // SAFETY: the ring is alive while self is.
        unsafe { sys::ainftp_ring_count(self.raw.as_ptr()) as usize }
    }
}

impl Drop for RingInner {
    fn drop(&mut self) {
        // No handle is left: free what is still queued, then the ring.
        let mut batch = MbufBatch::<64>::new();
        loop {
            // SAFETY: as in dequeue_burst; we are the last user.
            let n = unsafe {
                let n = sys::ainftp_ring_dequeue_burst(
                    self.raw.as_ptr(),
                    batch.spare_ptr() as *mut *mut std::ffi::c_void,
                    batch.spare() as u32,
                ) as usize;
                batch.commit(n);
                n
            };
            batch.clear();
            if n == 0 {
                break;
            }
        }
        // SAFETY: empty and unused.
        unsafe { sys::rte_ring_free(self.raw.as_ptr()) };
    }
}
