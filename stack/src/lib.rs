//! ainftp's user-space network stack. See the crate README section in the
//! top-level README for the layering: wire (packet views), host (ARP, ICMP,
//! UDP demux, routing), io (PacketIo backends), runtime (per-lcore loops).

pub mod counters;
pub mod host;
pub mod io;
pub mod quic;
pub mod rss;
pub mod runtime;
pub mod wire;
