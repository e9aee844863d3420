//! QUIC over any `PacketIo` backend, with quiche as the sans-IO protocol
//! engine. One `Endpoint` per lcore: it owns its connections (their IDs
//! name the lcore, see `cid`), decrypts received datagrams in place in the
//! backend's buffers (mbufs on DPDK) and lets quiche write outgoing
//! packets straight into freshly allocated ones.
//!
//! The same endpoint runs over DPDK ports, kernel UDP sockets and the
//! in-memory impaired network, so everything above is tested on all three.

pub mod certs;
pub mod cid;
pub mod config;
pub mod endpoint;
pub mod lcore;
pub mod perf;
pub mod shared_buf;
pub mod stall;
pub mod token;

pub use config::{QuicConfig, Trust, ALPN};
pub use endpoint::{
    CloseReason, ConnHandle, ConnStats, Endpoint, EndpointStats, Event, HANDSHAKE_GRACE,
};
pub use shared_buf::{SharedBuf, SharedBufFactory};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum QuicError {
    #[error("quic: {0}")]
    Protocol(#[from] quiche::Error),
    #[error("cannot load {0}: expected a PEM file (make one with `ainftp-dp certs`)")]
    Certificate(PathBuf),
    #[error("{0} does not exist: make the cluster's files with `ainftp-dp certs`")]
    MissingFile(PathBuf),
    #[error("a certificate and key are required (servers, and clients under a cluster CA): make them with `ainftp-dp certs`")]
    MissingIdentity,
    #[error("unknown congestion control {0:?}: use cubic, reno or bbr2")]
    UnknownCongestionControl(String),
    #[error("this endpoint does not accept connections (it has no server configuration)")]
    NotServer,
    #[error("no such connection (closed?)")]
    NoConnection,
    #[error("connection limit reached ({0})")]
    TooManyConnections(usize),
}
