//! The one error type of gpudirect; each message names the fix.

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error(
        "no {page_kb} kB hugepages for {len} bytes ({source}): reserve more \
         (echo N > /sys/kernel/mm/hugepages/hugepages-{page_kb}kB/nr_hugepages, \
         or scripts/setup-host.sh), or allow the fallback to normal pages"
    )]
    NoHugepages {
        page_kb: usize,
        len: usize,
        source: std::io::Error,
    },
    #[error("mmap of {len} bytes failed: {source}; free memory or ask for a smaller arena")]
    Map { len: usize, source: std::io::Error },
    #[error(
        "mlock of {len} bytes failed: {source}; raise the locked-memory limit \
         (ulimit -l unlimited, LimitMEMLOCK=infinity) or run as root"
    )]
    Lock { len: usize, source: std::io::Error },
    #[error(
        "mbind to NUMA node {node} failed: {source}; pick a node from \
         /sys/devices/system/node/online"
    )]
    Numa { node: u32, source: std::io::Error },
    #[error(
        "arena exhausted: {requested} bytes (alignment {align}) asked, {free} of {capacity} free, \
         largest free block {largest}: create a larger arena or drop regions"
    )]
    Exhausted {
        requested: usize,
        align: usize,
        free: usize,
        capacity: usize,
        largest: usize,
    },
    #[error(transparent)]
    Dpdk(#[from] dpdk_ffi::Error),
    #[error("CUDA driver: {0}")]
    Cuda(#[from] cudarc::driver::DriverError),
    #[error("NVRTC could not compile the codec kernels: {0}")]
    Nvrtc(String),
    #[error("{0} needs a CUDA GPU and this process runs host-only (no driver or no device)")]
    NoGpu(&'static str),
    #[error("device buffer {0} is still in use: call release({0}, ..) before reusing it")]
    SlotBusy(usize),
}
