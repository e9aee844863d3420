//! The crate's one error type.

use thiserror::Error;

/// Everything the engine, the codecs and the simulator can refuse.
///
/// A malformed or unexpected message is always an `Err`, never a panic: the
/// driver decides whether to drop the peer or abort the collective.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    #[error("message too short: {len} bytes, the header alone is {header} bytes")]
    Truncated { len: usize, header: usize },
    #[error("bad message magic {0:#04x}: the peer does not speak the ainftp collectives protocol")]
    BadMagic(u8),
    #[error("unsupported protocol version {0}: run the same ainftp version on every rank")]
    BadVersion(u8),
    #[error("unknown {field} value {value} in message header")]
    UnknownField { field: &'static str, value: u8 },
    #[error("payload is {got} bytes, the header announces {want} ({count} elements)")]
    PayloadLength {
        got: usize,
        want: usize,
        count: usize,
    },
    #[error("i16 chunk of {0} elements exceeds the codec limit of 65535")]
    ChunkTooLong(usize),
    #[error("invalid chunk scale {0:e}: must be finite, >= 0 and <= f32::MAX / 32767 (and 0 for f32 payloads)")]
    BadScale(f32),
    #[error(
        "non-finite value {value} at element {index}: the i16 codec only quantizes finite inputs"
    )]
    NonFinite { index: usize, value: f32 },
    #[error(
        "a chunk's largest magnitude {absmax:e} is too close to f32::MAX for the i16 codec: its dequantized values would overflow"
    )]
    ScaleOverflow { absmax: f32 },
    #[error("rank {rank} is out of range for a world of {world}")]
    RankOutOfRange { rank: usize, world: usize },
    #[error("invalid configuration: {0}")]
    Config(&'static str),
    #[error("buffer has {got} elements, this collective needs {want}")]
    BufferLength { got: usize, want: usize },
    #[error("a collective is already running; wait for it to complete before starting the next")]
    Busy,
    #[error("message from rank {from} for collective {seq}, which already completed (current {current})")]
    StaleMessage { from: usize, seq: u32, current: u32 },
    #[error("message from rank {from} is too far ahead (collective {seq}, current {current}); ranks must issue collectives in the same order")]
    TooFarAhead { from: usize, seq: u32, current: u32 },
    #[error("early-message buffer full ({limit} bytes): a peer runs too far ahead; raise Config::max_early_bytes")]
    EarlyBufferFull { limit: usize },
    #[error("unexpected message from rank {from}: {reason}")]
    Unexpected { from: usize, reason: &'static str },
    #[error("duplicate message from rank {from} (step {step}, chunk {chunk})")]
    Duplicate { from: usize, step: u16, chunk: u32 },
    #[error("a contribution filter only runs under Algo::Direct (or Auto); {0:?} cannot see individual contributions")]
    FilterNeedsDirect(crate::Algo),
    #[error("residual for tensor {tensor} has {got} elements, this collective has {want} (clear_residual when a tensor's length changes)")]
    ResidualLength {
        tensor: u64,
        got: usize,
        want: usize,
    },
    #[error("simulation stalled at t={time_ns} ns: {detail}")]
    Stalled { time_ns: u64, detail: String },
    #[error("rank {rank} failed in the simulation: {source}")]
    SimRank {
        rank: usize,
        #[source]
        source: Box<Error>,
    },
    #[error("transport: {0}")]
    Transport(String),
    #[error("device copy: {0}")]
    Device(String),
    #[error("rank {rank} ({addr}) sent nothing for {waited_ms} ms during collective {seq}: the peer is dead, hung, or not calling the communicator; raise DriverConfig::timeout if it is only slow")]
    PeerTimeout {
        rank: usize,
        addr: String,
        waited_ms: u64,
        seq: u32,
    },
    #[error("what this rank sent to rank {rank} ({addr}) has been lost, not acknowledged, for {waited_ms} ms during collective {seq}, though rank {rank}'s own packets may arrive: the path drops this rank's packets (datagrams too big for it, with path MTU discovery off?)")]
    PeerStalled {
        rank: usize,
        addr: String,
        waited_ms: u64,
        seq: u32,
    },
    #[error("collective {seq} made no progress for {waited_ms} ms: no message of it moved to or from any rank, though every rank is heard; {} (every rank must run the same collectives, and DriverConfig::timeout must exceed how late a healthy rank may enter one)", no_progress_culprits(.waiting_on, .not_entered))]
    NoProgress {
        seq: u32,
        waited_ms: u64,
        /// Ranks from which this rank still needs messages of it.
        waiting_on: Vec<usize>,
        /// Of those, the ones that have not entered it: they owe messages
        /// that a rank sends as soon as it enters.
        not_entered: Vec<usize>,
    },
    #[error("shut down after waiting {waited_ms} ms for rank {rank} ({addr}) to finish: it has not finished its stream, so it may still need data from this rank, which completed {completed} collective(s) (a slower rank still at work, or one that runs more collectives)")]
    PeerUnfinished {
        rank: usize,
        addr: String,
        waited_ms: u64,
        completed: u32,
    },
    #[error("connection to rank {rank} ({addr}) closed: {reason}")]
    PeerClosed {
        rank: usize,
        addr: String,
        reason: String,
    },
    #[error("{}", peer_left(*rank, addr, *completed, *seq, *failed, *cause))]
    PeerLeft {
        rank: usize,
        addr: String,
        /// Collectives the peer completed before it left.
        completed: u32,
        /// This rank's collective (0-based) that cannot complete.
        seq: u32,
        /// The peer left after a failure of its own (not a clean shutdown).
        failed: bool,
        /// The rank the peer's failure named, if any.
        cause: Option<usize>,
    },
    #[error("rank {rank} ({addr}) is gone: its UDP port is closed (ICMP port unreachable), so its process exited or crashed without saying goodbye (during collective {seq})")]
    PeerGone { rank: usize, addr: String, seq: u32 },
    #[error("rank {rank} ({addr}) is gone: its connection to the rendezvous (rank 0) closed without a goodbye, so its process exited or crashed (during collective {seq})")]
    PeerLost { rank: usize, addr: String, seq: u32 },
    #[error("could not connect to ranks {missing:?} within {waited_ms} ms: are they running, and are their addresses reachable from here?")]
    ConnectTimeout { missing: Vec<usize>, waited_ms: u64 },
    #[error("protocol violation on the connection to {peer}: {reason}")]
    Framing { peer: String, reason: String },
    #[error("rank {rank} ({addr}) sent what this rank cannot take: {source}")]
    FromPeer {
        rank: usize,
        addr: String,
        #[source]
        source: Box<Error>,
    },
    #[error("environment variable {var}: {problem} (torchrun convention: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")]
    Env { var: &'static str, problem: String },
    #[error("rendezvous: {0}")]
    Rendezvous(String),
    #[error("unknown operation handle {0} (already waited for?)")]
    UnknownHandle(u64),
    #[error("the communicator failed earlier and cannot run collectives: {0}")]
    Failed(Box<Error>),
    #[error("the communicator's progress thread {0}")]
    ProgressThread(&'static str),
}

impl Error {
    /// The peer this error blames, followed back to the root cause when a
    /// peer left because of another: what a failing rank's goodbye names.
    pub fn peer_at_fault(&self) -> Option<usize> {
        match self {
            Error::PeerTimeout { rank, .. }
            | Error::PeerUnfinished { rank, .. }
            | Error::PeerStalled { rank, .. }
            | Error::PeerClosed { rank, .. }
            | Error::PeerGone { rank, .. }
            | Error::PeerLost { rank, .. }
            | Error::FromPeer { rank, .. } => Some(*rank),
            Error::PeerLeft { rank, cause, .. } => Some(cause.unwrap_or(*rank)),
            Error::NoProgress { not_entered, .. } if not_entered.len() == 1 => Some(not_entered[0]),
            Error::Failed(e) => e.peer_at_fault(),
            _ => None,
        }
    }
}

fn no_progress_culprits(waiting_on: &[usize], not_entered: &[usize]) -> String {
    match (waiting_on, not_entered) {
        ([], _) => "a rank has not entered it".into(),
        (_, []) => format!(
            "this rank awaits messages of it from ranks {waiting_on:?}, none of which it can tell has not entered it: one of them has not, or waits on a rank that has not (a rank that sends to it as soon as it enters names it)"
        ),
        _ => format!(
            "this rank awaits messages of it from ranks {waiting_on:?}, and ranks {not_entered:?} have not entered it (they sent none of what a rank sends on entering)"
        ),
    }
}

fn peer_left(
    rank: usize,
    addr: &str,
    completed: u32,
    seq: u32,
    failed: bool,
    cause: Option<usize>,
) -> String {
    let cause = match (failed, cause) {
        (true, Some(c)) => format!("its own collective failed because of rank {c}"),
        (true, None) => "its own collective failed".into(),
        (false, _) => "every rank must run the same collectives".into(),
    };
    // It completed this one too, but not all it sent of it arrived.
    let cut_off = match seq < completed {
        true => ", and what it sent of it was cut off when it closed",
        false => "",
    };
    format!(
        "rank {rank} ({addr}) left after completing {completed} collective(s); this rank is in collective {seq} (0-based), which cannot complete without it{cut_off}: {cause}"
    )
}

impl Error {
    /// A message that does not decode, or that does not fit the
    /// collective it names: the sender broke the protocol (or runs
    /// another version, or other collectives), not this rank.
    pub fn is_senders_doing(&self) -> bool {
        matches!(
            self,
            Error::Truncated { .. }
                | Error::BadMagic(_)
                | Error::BadVersion(_)
                | Error::UnknownField { .. }
                | Error::PayloadLength { .. }
                | Error::ChunkTooLong(_)
                | Error::BadScale(_)
                | Error::StaleMessage { .. }
                | Error::TooFarAhead { .. }
                | Error::Unexpected { .. }
                | Error::Duplicate { .. }
                | Error::Framing { .. }
        )
    }
}

/// Shorthand used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
