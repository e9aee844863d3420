//! External memory: a buffer DPDK did not allocate (e.g. a hugepage arena
//! that a GPU also maps) registered with EAL, so that extbuf mempools can put
//! packet data in it and devices can be given DMA mappings of it.

use std::sync::Arc;

use crate::eal::Eal;
use crate::error::{from_rte_errno, Error, Result};
use crate::sys;

/// Memory that stays mapped, resident and at the same address for as long
/// as the value lives.
///
/// # Safety
/// Implementors promise that `as_ptr()..as_ptr()+len()` is one mapping,
/// aligned to and a whole number of `page_size()` pages, locked in RAM
/// (its physical pages do not move: mlock or hugetlbfs), readable and
/// writable, and not unmapped before the value is dropped.
pub unsafe trait PinnedMemory: Send + Sync + 'static {
    fn as_ptr(&self) -> *mut u8;
    fn len(&self) -> usize;
    fn page_size(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How EAL hands addresses to devices (`--iova-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IovaMode {
    /// IOVA = virtual address (an IOMMU, or a PMD that needs no IOVA).
    Va,
    /// IOVA = physical address, per page.
    Pa,
}

impl IovaMode {
    /// The mode the running EAL chose.
    pub fn current(_eal: &Eal) -> IovaMode {
        // SAFETY: EAL is initialised (we are given a handle).
        let mode = unsafe { sys::rte_eal_iova_mode() };
        if mode == sys::rte_iova_mode_RTE_IOVA_VA {
            IovaMode::Va
        } else {
            IovaMode::Pa
        }
    }
}

/// A buffer registered with EAL as external memory; unregistered when the
/// last clone is dropped (after every pool built over it, which hold
/// clones).
#[derive(Clone)]
pub struct ExtMem {
    inner: Arc<ExtMemInner>,
}

struct ExtMemInner {
    mem: Arc<dyn PinnedMemory>,
    /// IOVA of each page.
    iovas: Vec<u64>,
    mode: IovaMode,
    _eal: Eal,
}

/// DPDK's RTE_BAD_IOVA / RTE_BAD_PHYS_ADDR: `(uint64_t)-1`.
const BAD_IOVA: u64 = u64::MAX;

impl ExtMem {
    /// Register `mem` with EAL. In IOVA-as-VA mode each page's IOVA is its
    /// address; in PA mode it is the page's physical address, read from
    /// /proc/self/pagemap (root only).
    pub fn register(eal: &Eal, mem: Arc<dyn PinnedMemory>) -> Result<ExtMem> {
        let (base, len, page) = (mem.as_ptr() as usize, mem.len(), mem.page_size());
        if len == 0 || !page.is_power_of_two() || base % page != 0 || len % page != 0 {
            return Err(Error::InvalidArgument(format!(
                "external memory at {base:#x} of {len} bytes is not a whole number of {page}-byte pages"
            )));
        }
        let mode = IovaMode::current(eal);
        let n_pages = len / page;
        let mut iovas = Vec::with_capacity(n_pages);
        for i in 0..n_pages {
            let va = base + i * page;
            let iova = match mode {
                IovaMode::Va => va as u64,
                // SAFETY: va lies in a resident, locked mapping that `mem`
                // keeps alive; virt2phy only reads /proc/self/pagemap.
                IovaMode::Pa => unsafe { sys::rte_mem_virt2phy(va as *const _) },
            };
            if iova == BAD_IOVA {
                return Err(Error::InvalidArgument(format!(
                    "no physical address for page {va:#x} (IOVA mode PA reads /proc/self/pagemap, \
                     which needs root): run as root or start EAL with --iova-mode=va"
                )));
            }
            iovas.push(iova);
        }
        // SAFETY: the range is page-aligned, resident and outlives the
        // registration (ExtMemInner holds `mem` and unregisters in Drop);
        // iovas has one entry per page and DPDK copies it.
        let rc = unsafe {
            sys::rte_extmem_register(
                base as *mut _,
                len,
                iovas.as_mut_ptr(),
                n_pages as u32,
                page,
            )
        };
        if rc != 0 {
            return Err(from_rte_errno("rte_extmem_register"));
        }
        tracing::debug!(
            base = format_args!("{base:#x}"),
            len,
            page,
            ?mode,
            "external memory registered"
        );
        Ok(ExtMem {
            inner: Arc::new(ExtMemInner {
                mem,
                iovas,
                mode,
                _eal: eal.clone(),
            }),
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.mem.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.inner.mem.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn page_size(&self) -> usize {
        self.inner.mem.page_size()
    }

    pub fn iova_mode(&self) -> IovaMode {
        self.inner.mode
    }

    /// The IOVA of the byte at `offset`.
    pub fn iova(&self, offset: usize) -> u64 {
        let page = self.page_size();
        self.inner.iovas[offset / page] + (offset % page) as u64
    }

    /// Whether `ptr` points into this memory.
    pub fn contains(&self, ptr: *const u8) -> bool {
        let base = self.as_ptr() as usize;
        (base..base + self.len()).contains(&(ptr as usize))
    }

    /// `range` cut into runs that are contiguous in IOVA space: one run in
    /// VA mode, up to one per page in PA mode. Each run is (offset, len).
    pub fn iova_runs(&self, range: std::ops::Range<usize>) -> Vec<(usize, usize)> {
        let page = self.page_size();
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut off = range.start;
        while off < range.end {
            let end = ((off / page + 1) * page).min(range.end);
            match runs.last_mut() {
                Some((start, len)) if self.iova(*start) + *len as u64 == self.iova(off) => {
                    *len += end - off
                }
                _ => runs.push((off, end - off)),
            }
            off = end;
        }
        runs
    }

    /// Give `dev` a DMA mapping of this memory, held until the returned
    /// value is dropped. Buses that map through an IOMMU (PCI with vfio)
    /// need this before the NIC can write into the memory. Virtual devices
    /// (net_tap, net_af_xdp, net_null, net_memif) copy packets with the CPU
    /// and need none: the vdev bus accepts the call as a no-op, and a bus
    /// without DMA mapping support (ENOTSUP) is treated the same way.
    ///
    /// `Port::open` calls this for a pool's external memory; the port holds
    /// the mapping and unmaps it after stopping the device.
    pub(crate) fn dma_map(&self, dev: *mut sys::rte_device, port: u16) -> Result<DmaMap> {
        let mut map = DmaMap {
            ext: self.clone(),
            dev,
            mapped: Vec::new(),
        };
        for (off, len) in self.iova_runs(0..self.len()) {
            // SAFETY: dev is a live, probed device (the caller's port is
            // open); the range is registered external memory.
            let rc = unsafe {
                sys::rte_dev_dma_map(dev, self.as_ptr().add(off) as *mut _, self.iova(off), len)
            };
            if rc != 0 {
                let errno = crate::error::last_errno();
                if errno == libc::ENOTSUP && map.mapped.is_empty() {
                    tracing::debug!(port, "bus needs no DMA mapping");
                    break;
                }
                // Dropping `map` undoes what was mapped so far.
                return Err(from_rte_errno("rte_dev_dma_map"));
            }
            map.mapped.push((off, len));
        }
        Ok(map)
    }
}

impl std::fmt::Debug for ExtMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtMem")
            .field("base", &self.as_ptr())
            .field("len", &self.len())
            .field("page_size", &self.page_size())
            .field("iova_mode", &self.inner.mode)
            .finish()
    }
}

impl Drop for ExtMemInner {
    fn drop(&mut self) {
        // SAFETY: registered in ExtMem::register with this address and
        // length; every pool over it held a clone and is gone.
        let rc = unsafe { sys::rte_extmem_unregister(self.mem.as_ptr() as *mut _, self.mem.len()) };
        if rc != 0 {
            tracing::warn!(error = %from_rte_errno("rte_extmem_unregister"), "external memory left registered");
        }
    }
}

/// A device's DMA mapping of external memory; unmapped on drop, which its
/// port does after stopping the device and before closing it.
pub(crate) struct DmaMap {
    ext: ExtMem,
    dev: *mut sys::rte_device,
    /// (offset, len) of each mapped IOVA run; empty when the bus needs none.
    mapped: Vec<(usize, usize)>,
}

// SAFETY: the device pointer is only passed back to DPDK's thread-safe
// dma_unmap, while the port that owns both is still open.
unsafe impl Send for DmaMap {}
// SAFETY: as above; shared references only read `mapped`.
unsafe impl Sync for DmaMap {}

impl DmaMap {
    /// IOVA-contiguous runs handed to the bus (0 when it has no DMA
    /// mapping support; the vdev bus takes them and does nothing).
    pub(crate) fn runs(&self) -> usize {
        self.mapped.len()
    }
}

impl Drop for DmaMap {
    fn drop(&mut self) {
        for &(off, len) in &self.mapped {
            // SAFETY: this exact run was mapped for this live device.
            let rc = unsafe {
                sys::rte_dev_dma_unmap(
                    self.dev,
                    self.ext.as_ptr().add(off) as *mut _,
                    self.ext.iova(off),
                    len,
                )
            };
            if rc != 0 {
                tracing::warn!(error = %from_rte_errno("rte_dev_dma_unmap"), "DMA mapping left in place");
            }
        }
    }
}
