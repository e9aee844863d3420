//! The tools' error type. Binaries print it as one line and exit non-zero.

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad command-line input; the message names the fix.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Dpdk(#[from] dpdk_ffi::Error),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error(transparent)]
    Collectives(#[from] collectives::Error),
}
