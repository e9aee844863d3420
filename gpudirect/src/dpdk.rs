//! An arena registered with DPDK as external memory, and pktmbuf pools whose
//! data buffers are carved from it, so received payloads land in memory the
//! GPU can also reach.

use dpdk_ffi::{Eal, ExtMem, IovaMode, Mempool};

use crate::arena::{Align, Arena, CACHE_LINE};
use crate::error::{Error, Result};

/// The arena's whole mapping registered with EAL (rte_extmem_register);
/// unregistered when this and every pool over it are gone.
pub struct DpdkArena {
    eal: Eal,
    arena: Arena,
    ext: ExtMem,
}

impl DpdkArena {
    /// Refuses an arena of normal pages when EAL runs IOVA as physical
    /// addresses: the kernel may move such pages (compaction migrates
    /// even locked ones) while the NIC still writes to the old frame.
    /// Hugepages stay put; in VA mode the IOMMU mapping pins the pages.
    pub fn register(eal: &Eal, arena: &Arena) -> Result<DpdkArena> {
        if !arena.is_huge() && IovaMode::current(eal) == IovaMode::Pa {
            return Err(Error::InvalidArgument(
                "an arena of normal pages cannot take DMA in IOVA-as-PA mode (the kernel may move its pages under the NIC): reserve hugepages or run EAL with --iova-mode=va".into(),
            ));
        }
        let ext = ExtMem::register(eal, arena.memory().clone())?;
        Ok(DpdkArena {
            eal: eal.clone(),
            arena: arena.clone(),
            ext,
        })
    }

    pub fn ext_mem(&self) -> &ExtMem {
        &self.ext
    }

    pub fn iova_mode(&self) -> IovaMode {
        self.ext.iova_mode()
    }

    /// A pool of `n` mbufs with `data_room` bytes of data each (headroom
    /// included) in an arena region that the pool keeps until it is freed.
    /// A port opened with the pool DMA-maps the arena for its device
    /// (`dpdk_ffi::Port::open`).
    pub fn pktmbuf_pool(&self, name: &str, n: u32, cache: u32, data_room: u16) -> Result<Mempool> {
        if n == 0 || data_room == 0 {
            return Err(Error::InvalidArgument(format!(
                "a pool of {n} mbufs with a data room of {data_room} bytes: both must be above 0"
            )));
        }
        let elt = (data_room as usize).div_ceil(CACHE_LINE) * CACHE_LINE;
        let page = self.arena.page_size().bytes();
        // In PA mode buffers may not cross a page (IOVA is only contiguous
        // within one), so the region is whole pages with room at each end.
        let (len, align) = match self.iova_mode() {
            IovaMode::Va => (n as usize * elt, Align::CacheLine),
            IovaMode::Pa => {
                let per_page = page / elt;
                if per_page == 0 {
                    return Err(Error::InvalidArgument(format!(
                        "data room {data_room} exceeds the arena's {page}-byte pages in IOVA-as-PA mode: \
                         use hugepages or --iova-mode=va"
                    )));
                }
                ((n as usize).div_ceil(per_page) * page, Align::Page)
            }
        };
        let region = self.arena.alloc(len, align)?;
        let range = region.offset()..region.offset() + region.len();
        let socket = self.arena.memory().numa_node().map(|n| n as i32);
        // SAFETY: `range` is `region`'s, which the arena hands to nobody
        // else while it lives, and the pool keeps it alive.
        Ok(unsafe {
            Mempool::new_extbuf(
                &self.eal,
                name,
                n,
                cache,
                data_room,
                socket,
                &self.ext,
                range,
                Box::new(region),
            )
        }?)
    }
}
