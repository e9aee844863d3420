//! gpudirect: memory that the NIC (through DPDK) and the GPU (through CUDA)
//! both reach, so a reduced gradient bucket goes from the wire to the device
//! without an extra copy.
//!
//! - [`Arena`]: page-locked 2 MB / 1 GB hugepages (normal pages as a
//!   fallback), NUMA-bound where the machine has several nodes, with an
//!   aligned allocator handing out [`Region`]s.
//! - [`DpdkArena`]: the arena registered as DPDK external memory, and mbuf
//!   pools whose packet data lies in it.
//! - [`Gpu`]: CUDA loaded at run time (host-only when there is no driver or
//!   device), page-locking the arena for the GPU.
//! - [`DeviceMirror`]: double-buffered async copies of buckets to the device
//!   and back, the same API in host-only mode.
//! - [`GpuCodec`]: the i16 + scale codec kernels, bit-compatible with the CPU
//!   codec.
//!
//! ```no_run
//! use gpudirect::{Align, Arena, DeviceMirror, Gpu, MemOptions};
//! let arena = Arena::new(64 << 20, &MemOptions::default()).unwrap();
//! let mut bucket = arena.alloc(4 << 20, Align::CacheLine).unwrap();
//! bucket.as_mut_slice().fill(1);
//! let gpu = Gpu::probe();                      // host-only without CUDA
//! let _pinned = gpu.register_host(arena.memory().clone()).unwrap();
//! let mut mirror = DeviceMirror::new(&gpu, 4 << 20).unwrap();
//! let slot = mirror.upload(bucket.as_slice()).unwrap().wait().unwrap();
//! // ... use mirror.device(slot) on the GPU, then:
//! mirror.release(slot, None).unwrap();
//! ```

mod arena;
pub mod bench;
mod codec;
mod dpdk;
mod error;
mod gpu;
mod hugemem;
mod mirror;
pub mod numa;

pub use arena::{Align, Arena, Region, CACHE_LINE};
pub use codec::{GpuCodec, Rounding, MAX_CHUNK};
pub use dpdk::DpdkArena;
pub use error::{Error, Result};
pub use gpu::{Gpu, HostRegistration};
pub use hugemem::{HugeMem, MemOptions, PageSize};
pub use mirror::{DeviceMirror, Transfer, SLOTS};

/// cudarc, re-exported so callers name the same CUDA types.
pub use cudarc;
