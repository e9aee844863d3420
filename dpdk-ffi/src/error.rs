//! The one error type of dpdk-ffi. Every DPDK failure carries rte_errno and
//! the text rte_strerror gives for it.

use std::ffi::CStr;

use crate::sys;

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} failed: {text} (rte_errno {errno})")]
    Dpdk {
        op: &'static str,
        errno: i32,
        text: String,
    },
    #[error("the DPDK EAL can be initialised once per process; clone the existing Eal instead")]
    AlreadyInitialised,
    #[error(
        "no usable hugepages: {0}; run scripts/setup-host.sh (as root) to reserve and mount them"
    )]
    NoHugepages(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Port(String),
    #[error("mempool '{0}' is exhausted: free mbufs or create a larger pool")]
    PoolExhausted(String),
    #[error("mbuf has {available} bytes of {room}, {wanted} needed")]
    NoRoom {
        room: &'static str,
        wanted: usize,
        available: usize,
    },
    #[error("the closure running on lcore {0} panicked")]
    LcorePanicked(u32),
}

/// The text DPDK gives for an errno (DPDK's own codes included).
pub fn strerror(errno: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local
    // NUL-terminated string that stays valid until the next call on this
    // thread; we copy it out at once.
    unsafe { CStr::from_ptr(sys::rte_strerror(errno)) }
        .to_string_lossy()
        .into_owned()
}

/// The calling thread's rte_errno.
pub fn last_errno() -> i32 {
    // SAFETY: reads a thread-local int; no preconditions.
    unsafe { sys::ainftp_errno() }
}

/// An error for `op` from an errno value (the sign does not matter: ethdev
/// returns -errno, EAL sets rte_errno).
pub(crate) fn dpdk(op: &'static str, errno: i32) -> Error {
    let errno = errno.abs();
    Error::Dpdk {
        op,
        errno,
        text: strerror(errno),
    }
}

/// An error for `op` from the calling thread's rte_errno.
pub(crate) fn from_rte_errno(op: &'static str) -> Error {
    dpdk(op, last_errno())
}
