//! # The driver: collectives over QUIC
//!
//! [`Communicator`] runs an [`Engine`](crate::Engine) over QUIC
//! ([`stack::quic::Endpoint`]) on any [`Backend`] (a `PacketIo` that can
//! sleep until traffic arrives; kernel UDP out of the box).
//!
//! ```text
//! let mut comm = Communicator::from_env(DriverConfig::default())?;  // torchrun env
//! comm.all_reduce(&mut grads, ReduceOp::Sum)?;                      // blocking
//! let h = comm.start(Collective::all_gather(), shards)?;           // non-blocking
//! while !comm.test(&h)? { compute_a_bit(); }
//! let gathered = comm.wait(h)?;
//! ```
//!
//! * **Connections.** One QUIC endpoint per rank; rank `i` dials every
//!   `j > i` `conns_per_peer` times (messages to a peer are striped over
//!   its connections round-robin). Each connection carries one long-lived
//!   bidirectional stream; its first frame is the dialler's hello (rank).
//! * **Framing.** `u32` little-endian length + one engine message. The
//!   receiver reassembles in a per-stream buffer and hands each complete
//!   frame to `Engine::handle` in place (no copy between the stream read
//!   and the decode/reduce).
//! * **Backpressure.** Messages move from the engine into link queues only
//!   while the driver holds less than `max_pending_bytes`; the queues feed
//!   QUIC as flow and congestion control accept (`stream_send` returning
//!   less is counted in `send_blocked`). The engine produces its sends
//!   eagerly, so its own outbox is bounded by the collective's size.
//! * **Where the loop runs.** In the caller's thread, inside the calls
//!   (module `communicator`): no thread hand-off on the latency path, but
//!   progress only while the caller is in a call (`test` polls once).
//!   [`Background`] moves a communicator (or a rank's [`Lanes`]) onto a
//!   progress thread instead, so buckets are reduced while the caller
//!   computes, and wakes the caller once per bucket.
//!   When it waits, it sets the calling thread's timer slack to 1 us
//!   (once), so that its short naps and poll timeouts end on time.
//! * **Liveness.** During a collective every peer is pinged (QUIC
//!   ack-eliciting frames) each `timeout / 4`; a peer not heard from for
//!   `timeout` fails the collective with [`Error::PeerTimeout`] naming
//!   it, one that is heard but to which what we send is lost, not
//!   acknowledged, for `timeout` (a path that drops our packets) with
//!   [`Error::PeerStalled`], and a closed connection with
//!   [`Error::PeerClosed`]. A rank that
//!   shuts down (or drops its communicator) first sends a goodbye frame
//!   naming how many collectives it completed; a peer in a later one
//!   fails at once with [`Error::PeerLeft`] (uneven iteration counts are
//!   named, not timed out). Over kernel UDP a rank whose process died
//!   without a word is found by its closed port (the kernel's ICMP port
//!   unreachable, read from the socket's error queue): [`Error::PeerGone`]
//!   once it has also been silent for a second since (a NAT that moved a
//!   live rank to a new port leaves the old one closed; links follow the
//!   address QUIC follows), instead of a timeout. Not in a job joined
//!   through the rendezvous, whose liveness links say more. On every
//!   transport, a job
//!   joined through the rendezvous keeps each rank's TCP connection to
//!   rank 0 open (module `watch`): a process that dies has it closed by
//!   its kernel, rank 0 tells the others, and the collective fails with
//!   [`Error::PeerLost`] within about a quarter second (also on our DPDK
//!   stack, where nothing else but the timeout would tell). After such an
//!   error the communicator refuses further work ([`Error::Failed`]).
//!   A collective in which no message moves for `timeout` though every
//!   rank is heard (a rank whose progress thread answers for it has not
//!   entered the collective) fails with [`Error::NoProgress`]: `timeout`
//!   must exceed how late a healthy rank may enter a collective.
//! * **To the GPU.** [`DevicePipeline`] all-reduces a step's buckets in
//!   order and copies each reduced bucket to device memory while the next
//!   one is on the wire (host-only without a GPU).
//! * **Counters.** [`DriverCounters`]: datagrams and bytes on the wire,
//!   frames, backpressure, caller wake-ups (one per finished collective)
//!   and idle sleeps, plus the engine's.
//!
//! [`Error::PeerTimeout`]: crate::Error::PeerTimeout
//! [`Error::PeerStalled`]: crate::Error::PeerStalled
//! [`Error::NoProgress`]: crate::Error::NoProgress
//! [`Error::PeerClosed`]: crate::Error::PeerClosed
//! [`Error::PeerLeft`]: crate::Error::PeerLeft
//! [`Error::PeerGone`]: crate::Error::PeerGone
//! [`Error::PeerLost`]: crate::Error::PeerLost
//! [`Error::Failed`]: crate::Error::Failed

pub mod backend;
pub mod background;
pub mod communicator;
pub mod device;
pub mod framing;
pub mod goodbye;
mod identity;
pub mod lane_layout;
pub mod lanes;
pub mod mesh;
mod ready;
pub mod rendezvous;
pub mod watch;

use std::time::Duration;

use stack::io::kernel::KernelUdpConfig;
use stack::quic::QuicConfig;

pub use backend::{Backend, WireCounters};
pub use background::{Background, Collectives, Pending};
pub use communicator::{Communicator, DriverCounters, OpHandle};
pub use device::{DeviceCounters, DevicePipeline, OnDevice};
pub use lanes::Lanes;
pub use rendezvous::{Lane, RankEnv};

/// Driver configuration; every rank must use the same `engine` config.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    pub engine: crate::Config,
    /// QUIC connections per peer (messages are striped over them).
    pub conns_per_peer: usize,
    /// A peer silent this long during a collective fails it, and so does a
    /// collective in which nothing moved this long (`Error::NoProgress`):
    /// it bounds how late a healthy rank may enter a collective.
    pub timeout: Duration,
    /// Joining the job gives up after this: the rendezvous and connecting
    /// the mesh (of every lane) share this one budget, except that the
    /// connections, and with several lanes each lane's rendezvous after
    /// the first, always get at least a quarter of it (at most 5 s), for a
    /// job whose last rank came late: a join with N lanes may take up to
    /// N such quarters longer.
    pub connect_timeout: Duration,
    /// Bytes queued in the driver beyond what QUIC accepted, at most.
    pub max_pending_bytes: usize,
    /// How long the loop spins without traffic before sleeping in poll(2).
    pub spin: Duration,
    /// TLS identity and QUIC tuning (windows, congestion control). Without
    /// a certificate: a throw-away self-signed identity and no peer
    /// verification; `QuicConfig::cluster_node` with this rank's node,
    /// named `mesh::node_name(rank)`, for mutual TLS. (The ALPN,
    /// UDP payload and idle timeout are set by the driver.)
    pub quic: QuicConfig,
    /// The kernel UDP socket of `Communicator::new` / `from_env`.
    pub udp: KernelUdpConfig,
    /// `from_env`: size datagrams by the MTU of the route to MASTER_ADDR
    /// (minus IPv4 + UDP headers), at most this many bytes, instead of
    /// `udp.max_payload`; None: `udp.max_payload` as given. Per-packet
    /// costs (QUIC, syscalls) dominate at 1472 bytes: on loopback, 32 KiB
    /// datagrams gave 2-3x the bandwidth of 1472 and more than 64 KiB ones
    /// (scripts/bench-allreduce.sh).
    pub follow_route_mtu: Option<usize>,
}

impl DriverConfig {
    /// Refuses values the driver cannot honour: no connection per peer, a
    /// timeout of zero (every collective would fail at once) or beyond a
    /// year (a deadline that far out is a wait for ever, and `Instant`
    /// cannot add `Duration::MAX`), and no room for one queued message.
    pub fn validate(&self) -> crate::Result<()> {
        use crate::Error::Config;
        if self.conns_per_peer == 0 {
            return Err(Config("conns_per_peer must be at least 1"));
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(Config("timeout must be above zero and at most a year"));
        }
        if self.connect_timeout.is_zero() || self.connect_timeout > MAX_TIMEOUT {
            return Err(Config(
                "connect_timeout must be above zero and at most a year",
            ));
        }
        if self.max_pending_bytes == 0 {
            return Err(Config("max_pending_bytes must be at least 1"));
        }
        Ok(())
    }

    /// What is left of `connect_timeout` for a join that began at `start`
    /// (for the connections, see `connect_timeout`).
    pub(crate) fn connect_left(&self, start: std::time::Instant) -> Duration {
        let floor = (self.connect_timeout / 4).min(Duration::from_secs(5));
        self.connect_timeout
            .saturating_sub(start.elapsed())
            .max(floor)
            .max(Duration::from_millis(1))
    }

    /// A join that began at `start` failed: a connect timeout reports the
    /// whole join's time, not the connections' share of it.
    pub(crate) fn join_error(start: std::time::Instant, e: crate::Error) -> crate::Error {
        match e {
            crate::Error::ConnectTimeout { missing, .. } => crate::Error::ConnectTimeout {
                missing,
                waited_ms: start.elapsed().as_millis() as u64,
            },
            e => e,
        }
    }
}

/// The longest `timeout` and `connect_timeout` [`DriverConfig::validate`]
/// accepts.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The default cap of [`DriverConfig::follow_route_mtu`].
pub use stack::io::kernel::ROUTE_PAYLOAD_CAP;

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            engine: crate::Config::default(),
            conns_per_peer: 1,
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(60),
            max_pending_bytes: 4 << 20,
            spin: Duration::from_micros(50),
            quic: QuicConfig::default(),
            udp: KernelUdpConfig {
                // Loss on a full socket buffer costs a QUIC recovery
                // round (a tail loss: a whole probe timeout). The kernel
                // caps these at net.core.rmem_max / wmem_max, which
                // scripts/setup-host.sh raises to 32 MiB.
                recv_buffer: Some(32 << 20),
                send_buffer: Some(8 << 20),
                ..KernelUdpConfig::default()
            },
            follow_route_mtu: Some(ROUTE_PAYLOAD_CAP),
        }
    }
}
