//! `--mbuf-arena`: the stack's packet buffers in a gpudirect hugepage arena
//! registered with DPDK (external memory, DMA-mapped for the port) and,
//! when there is a GPU, with CUDA, so received payloads land in memory the
//! GPU reaches without another copy.

use dpdk_ffi::{Eal, Mempool};
use gpudirect::{Arena, DpdkArena, Gpu, HostRegistration, MemOptions};

use crate::error::{Error, Result};

/// The pool and what must outlive its use: the CUDA registration of the
/// arena. (The pool itself keeps the arena region and the DPDK
/// registration alive.)
pub struct ArenaPool {
    pool: Mempool,
    arena: Arena,
    gpu: Gpu,
    _cuda: HostRegistration,
}

impl ArenaPool {
    /// An arena for `mbufs` buffers of `data_room` bytes each (one whole
    /// frame: `stack::runtime::data_room`), registered with DPDK and CUDA
    /// (host-only without a GPU), and a pool over it.
    pub fn new(eal: &Eal, mbufs: u32, data_room: u16) -> Result<ArenaPool> {
        let err = |e: gpudirect::Error| Error::Usage(format!("--mbuf-arena: {e}"));
        let room = data_room as usize;
        // Twice the buffers' bytes: in IOVA-as-PA mode each page holds whole
        // buffers only. (There an arena of normal pages, the fallback when
        // hugepages run short, is refused: the kernel may move its pages.)
        let len = 2 * mbufs as usize * room.next_multiple_of(gpudirect::CACHE_LINE) + (4 << 20);
        let arena = Arena::new(len, &MemOptions::default()).map_err(err)?;
        let dpdk = DpdkArena::register(eal, &arena).map_err(err)?;
        let pool = dpdk
            .pktmbuf_pool(&pool_name(), mbufs, 256, data_room)
            .map_err(err)?;
        let gpu = Gpu::probe();
        let cuda = gpu.register_host(arena.memory().clone()).map_err(err)?;
        Ok(ArenaPool {
            pool,
            arena,
            gpu,
            _cuda: cuda,
        })
    }

    pub fn pool(&self) -> &Mempool {
        &self.pool
    }

    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// One line for the log: where the buffers are and who can reach them.
    pub fn describe(&self) -> String {
        let base = self.arena.as_ptr() as usize;
        let page = self.arena.page_size().bytes();
        let cuda = match self.gpu.name() {
            Some(name) => format!("registered with CUDA on {name}"),
            None => "CUDA: host-only".into(),
        };
        format!(
            "{} mbufs in an arena at {base:#x}..{:#x} ({} KiB pages{}), registered with DPDK, {cuda}",
            self.pool.size(),
            base + self.arena.capacity(),
            page / 1024,
            if self.arena.is_huge() { ", huge" } else { ", normal: no hugepages reserved" },
        )
    }
}

/// A mempool name no other arena of this process has.
fn pool_name() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static ARENAS: AtomicUsize = AtomicUsize::new(0);
    let n = ARENAS.fetch_add(1, Ordering::Relaxed);
    format!("arena_{}_{n}", std::process::id())
}
