//! Packet-buffer (pktmbuf) pools in hugepage memory.

use std::ffi::CString;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::batch::MbufBatch;
use crate::eal::Eal;
use crate::error::{from_rte_errno, Error, Result};
use crate::extmem::ExtMem;
use crate::mbuf::Mbuf;
use crate::sys;

/// Default data room: 2048 bytes of packet plus the standard headroom.
pub const DEFAULT_DATA_ROOM: u16 = sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16;

/// The data room that holds a `frame_len`-byte frame in one mbuf after the
/// standard headroom (never less than the default).
pub fn data_room_for_frame(frame_len: usize) -> u16 {
    let room = sys::RTE_PKTMBUF_HEADROOM as usize + frame_len;
    room.clamp(DEFAULT_DATA_ROOM as usize, u16::MAX as usize) as u16
}

#[derive(Clone)]
pub struct Mempool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    raw: NonNull<sys::rte_mempool>,
    name: String,
    size: u32,
    data_room: u16,
    /// For extbuf pools: the external memory the data buffers live in and
    /// whatever keeps that part of it reserved. Both outlive the pool.
    ext: ManuallyDrop<Option<ExtBacking>>,
    eal: ManuallyDrop<Eal>,
}

struct ExtBacking {
    mem: ExtMem,
    _keep_alive: Box<dyn Send + Sync>,
}

// SAFETY: rte_mempool is designed for concurrent use from many threads
// (lock-free ring plus per-lcore caches); the pointer is never freed while a
// handle exists.
unsafe impl Send for PoolInner {}
// SAFETY: as above.
unsafe impl Sync for PoolInner {}

impl Mempool {
    /// A pool of `size` mbufs with `data_room` bytes each (headroom
    /// included), with a per-lcore cache of `cache` mbufs, on NUMA `socket`
    /// (None: any).
    pub fn new(
        eal: &Eal,
        name: &str,
        size: u32,
        cache: u32,
        data_room: u16,
        socket: Option<i32>,
    ) -> Result<Mempool> {
        let cname = c_name(name)?;
        let socket = socket.unwrap_or(sys::SOCKET_ID_ANY);
        // SAFETY: EAL is initialised (we hold `eal`); the name is a valid C
        // string that DPDK copies.
        let raw = unsafe {
            sys::rte_pktmbuf_pool_create(cname.as_ptr(), size, cache, 0, data_room, socket)
        };
        let raw = NonNull::new(raw).ok_or_else(|| from_rte_errno("rte_pktmbuf_pool_create"))?;
        Ok(Mempool::wrap(eal, raw, name, size, data_room, None))
    }

    /// A pool of `size` mbufs whose data buffers (`data_room` bytes each,
    /// headroom included) lie in `range` of the external memory `ext`
    /// instead of DPDK's heap; the mbuf headers stay in DPDK's hugepages.
    /// Received packets land in `ext`. `keep_alive` is held as long as the
    /// pool and is where the caller puts what reserves `range` (an arena
    /// allocation), so nothing else is handed that memory meanwhile.
    ///
    /// Buffers never straddle an IOVA discontinuity: in IOVA-as-PA mode
    /// each page is its own zone and the tail of a page that cannot hold a
    /// whole buffer is left unused.
    ///
    /// # Safety
    ///
    /// `range` of `ext` must be this pool's alone while `keep_alive`
    /// lives: nothing else (another pool, an arena region handed out)
    /// may read or write it, since mbufs hand out `&mut` views of it.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn new_extbuf(
        eal: &Eal,
        name: &str,
        size: u32,
        cache: u32,
        data_room: u16,
        socket: Option<i32>,
        ext: &ExtMem,
        range: std::ops::Range<usize>,
        keep_alive: Box<dyn Send + Sync>,
    ) -> Result<Mempool> {
        let cname = c_name(name)?;
        if range.start > range.end || range.end > ext.len() {
            return Err(Error::InvalidArgument(format!(
                "range {range:?} is outside the external memory ({} bytes)",
                ext.len()
            )));
        }
        if data_room == 0 {
            return Err(Error::InvalidArgument(
                "an external buffer pool needs a data room above 0".into(),
            ));
        }
        // Cache-line sized elements keep every buffer 64-byte aligned.
        let elt_size = (data_room as usize).div_ceil(64) * 64;
        if elt_size > u16::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "data room {data_room} is too large for an external buffer element"
            )));
        }
        let base = ext.as_ptr() as usize;
        let aligned_start = (base + range.start).next_multiple_of(64) - base;
        let zones: Vec<sys::rte_pktmbuf_extmem> = ext
            .iova_runs(aligned_start.min(range.end)..range.end)
            .into_iter()
            .filter(|&(_, len)| len >= elt_size)
            .map(|(off, len)| sys::rte_pktmbuf_extmem {
                // SAFETY (of the add): off < ext.len().
                buf_ptr: unsafe { ext.as_ptr().add(off) } as *mut _,
                buf_iova: ext.iova(off),
                buf_len: len / elt_size * elt_size,
                elt_size: elt_size as u16,
            })
            .collect();
        let capacity: usize = zones.iter().map(|z| z.buf_len / elt_size).sum();
        if capacity < size as usize {
            return Err(Error::InvalidArgument(format!(
                "{} bytes of external memory hold {capacity} buffers of {elt_size} bytes, \
                 {size} needed: give the pool more memory or fewer mbufs",
                range.len()
            )));
        }
        let socket = socket.unwrap_or(sys::SOCKET_ID_ANY);
        // SAFETY: EAL is initialised; the zones lie inside registered
        // external memory that the returned pool keeps alive (ExtBacking);
        // DPDK copies the name and the zone array.
        let raw = unsafe {
            sys::rte_pktmbuf_pool_create_extbuf(
                cname.as_ptr(),
                size,
                cache,
                0,
                data_room,
                socket,
                zones.as_ptr(),
                zones.len() as u32,
            )
        };
        let raw =
            NonNull::new(raw).ok_or_else(|| from_rte_errno("rte_pktmbuf_pool_create_extbuf"))?;
        tracing::debug!(
            pool = name,
            size,
            zones = zones.len(),
            elt_size,
            "extbuf mempool created"
        );
        let backing = ExtBacking {
            mem: ext.clone(),
            _keep_alive: keep_alive,
        };
        Ok(Mempool::wrap(
            eal,
            raw,
            name,
            size,
            data_room,
            Some(backing),
        ))
    }

    fn wrap(
        eal: &Eal,
        raw: NonNull<sys::rte_mempool>,
        name: &str,
        size: u32,
        data_room: u16,
        ext: Option<ExtBacking>,
    ) -> Mempool {
        Mempool {
            inner: Arc::new(PoolInner {
                raw,
                name: name.to_owned(),
                size,
                data_room,
                ext: ManuallyDrop::new(ext),
                eal: ManuallyDrop::new(eal.clone()),
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn size(&self) -> u32 {
        self.inner.size
    }

    /// Bytes of data per mbuf, headroom included.
    pub fn data_room(&self) -> u16 {
        self.inner.data_room
    }

    /// Bytes a packet may take in one mbuf: the data room after the
    /// standard headroom.
    pub fn packet_capacity(&self) -> usize {
        (self.inner.data_room as usize).saturating_sub(sys::RTE_PKTMBUF_HEADROOM as usize)
    }

    /// The external memory an extbuf pool's data buffers lie in (None for
    /// a pool on DPDK's own heap). A port opened with such a pool gives its
    /// device a DMA mapping of this memory (see `Port::open`).
    pub fn external_memory(&self) -> Option<&ExtMem> {
        self.inner.ext.as_ref().map(|e| &e.mem)
    }

    /// Mbufs free in the pool, per-lcore caches included.
    pub fn available(&self) -> u32 {
        // SAFETY: the pool is alive while self is.
        unsafe { sys::rte_mempool_avail_count(self.inner.raw.as_ptr()) }
    }

    /// Mbufs taken from the pool and not yet returned.
    pub fn in_use(&self) -> u32 {
        // SAFETY: the pool is alive while self is.
        unsafe { sys::rte_mempool_in_use_count(self.inner.raw.as_ptr()) }
    }

    pub fn alloc(&self) -> Result<Mbuf> {
        // SAFETY: the pool is alive and is a pktmbuf pool.
        let m = unsafe { sys::ainftp_pktmbuf_alloc(self.inner.raw.as_ptr()) };
        match NonNull::new(m) {
            // SAFETY: a freshly allocated mbuf is ours alone.
            Some(m) => Ok(unsafe { Mbuf::from_raw(m) }),
            None => Err(Error::PoolExhausted(self.inner.name.clone())),
        }
    }

    /// Fill the batch's free slots with `n` fresh mbufs, all or none.
    pub fn alloc_bulk<const N: usize>(&self, batch: &mut MbufBatch<N>, n: usize) -> Result<()> {
        let n = n.min(batch.spare());
        if n == 0 {
            return Ok(());
        }
        // SAFETY: the batch's spare slots have room for n pointers; on
        // success all n are valid fresh mbufs that the batch now owns.
        let rc = unsafe {
            sys::ainftp_pktmbuf_alloc_bulk(self.inner.raw.as_ptr(), batch.spare_ptr(), n as u32)
        };
        if rc != 0 {
            return Err(Error::PoolExhausted(self.inner.name.clone()));
        }
        // SAFETY: n slots were just filled with owned mbufs.
        unsafe { batch.commit(n) };
        Ok(())
    }

    pub fn as_ptr(&self) -> *mut sys::rte_mempool {
        self.inner.raw.as_ptr()
    }
}

fn c_name(name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| Error::InvalidArgument(format!("pool name {name:?} has a NUL")))
}

impl std::fmt::Debug for Mempool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mempool")
            .field("name", &self.inner.name)
            .field("size", &self.inner.size)
            .field("data_room", &self.inner.data_room)
            .field("external", &self.external_memory().is_some())
            .finish()
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // SAFETY: the pool is alive; the count is a read.
        let in_use = unsafe { sys::rte_mempool_in_use_count(self.raw.as_ptr()) };
        if in_use != 0 {
            // Mbufs still point into this pool: freeing it (or the EAL's
            // memory) would leave them dangling, so both stay. Some PMDs
            // (net_af_xdp) keep their fill-ring mbufs after close, so this
            // is expected at exit and not an error.
            tracing::debug!(pool = %self.name, in_use, "mempool dropped with mbufs in use; leaking it");
            return;
        }
        // SAFETY: no mbuf of this pool is outstanding and no handle is left.
        unsafe { sys::rte_mempool_free(self.raw.as_ptr()) };
        // SAFETY: dropped exactly once, here, after the pool that used the
        // external memory is gone (and before the EAL it is registered in).
        unsafe { ManuallyDrop::drop(&mut self.ext) };
        // SAFETY: dropped exactly once, here.
        unsafe { ManuallyDrop::drop(&mut self.eal) };
    }
}
