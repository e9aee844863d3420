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
    /// Results that differ from the reference (counted over all ranks).
    #[error("{0} wrong element(s) over all ranks and sizes: results differ from the reference beyond the tolerance")]
    WrongResults(u64),
    /// Ranks whose results are within tolerance but not bit-identical.
    #[error(
        "the ranks' results differ bit for bit in {0} row(s): every rank must get the same result"
    )]
    RanksDiffer(u64),
    /// A run that ended early (its peer went away) after measuring
    /// something: the binaries print `summary` as a good run's, then `why`.
    #[error("{why}")]
    EndedEarly {
        summary: serde_json::Value,
        why: String,
    },
}

impl From<stack::runtime::Error> for Error {
    /// A config the runtime refuses is the user's to fix.
    fn from(e: stack::runtime::Error) -> Error {
        match e {
            stack::runtime::Error::Dpdk(d) => Error::Dpdk(d),
            stack::runtime::Error::Config(c) => Error::Usage(c),
        }
    }
}
