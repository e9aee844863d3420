//! What an endpoint needs to know: identity, trust, protocol, limits. Turned
//! into quiche's configuration once per endpoint.

use std::path::PathBuf;
use std::time::Duration;

use super::certs::NodeFiles;
use super::QuicError;

/// ALPN of the ainftp protocol between nodes.
pub const ALPN: &[u8] = b"ainftp/1";

/// Paths a connection keeps at once, as quiche's
/// `active_connection_id_limit`. Released quiche 0.30 kept every path a
/// connection had used and stopped following its peer once this many
/// existed (at its default of 2, after one NAT rebinding); ours evicts the
/// path the connection left longest ago (third_party/quiche/PATCHES.md),
/// so this bounds memory, not rebindings. A path costs its recovery state
/// only once used.
pub const PATHS_PER_CONNECTION: u64 = 8;

/// How peers are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// Mutual TLS: both sides present a certificate issued by this CA, and
    /// a peer without one is refused.
    ClusterCa(PathBuf),
    /// No verification at all: only for benchmarks against peers that
    /// have no cluster certificate (the server still presents its own).
    InsecureNoVerify,
}

#[derive(Debug, Clone)]
pub struct QuicConfig {
    /// Protocols offered (client) or accepted (server), most preferred first.
    pub alpn: Vec<Vec<u8>>,
    /// This node's certificate chain and key (PEM). A server needs one; a
    /// client needs one under `Trust::ClusterCa`.
    pub cert_chain: Option<PathBuf>,
    pub private_key: Option<PathBuf>,
    pub trust: Trust,
    /// Largest UDP payload we send and accept; capped by the device's
    /// `max_payload()` at endpoint creation. Bigger datagrams cost fewer
    /// packets per byte (jumbo frames when the port allows).
    pub max_udp_payload: usize,
    /// Path MTU discovery (RFC 8899, quiche's): each connection starts at
    /// QUIC's 1200-byte floor and probes up to `max_udp_payload`, so a
    /// link narrower than either end's own (a tunnel, PPPoE, an overlay)
    /// costs some probes instead of every full-size packet. Our sends are
    /// DF and ICMP "fragmentation needed" is often filtered, so without
    /// it such a path black-holes a connection after its handshake.
    pub discover_pmtu: bool,
    /// A connection ends when nothing arrives from its peer for this long,
    /// and also when it makes no progress for this long though the peer is
    /// heard (what it sends is lost, hardly any of it acknowledged; see
    /// `quic::stall`). Zero: never.
    pub idle_timeout: Duration,
    /// An established connection that has sent nothing for this long sends
    /// a PING. A peer that only receives, with nothing of its own in
    /// flight, is otherwise silent once packets stop reaching it: if its
    /// NAT rebinds it meanwhile, the sender keeps sending to the old
    /// address until the idle timeout. The PING comes from the new address,
    /// and the sender moves there. It also keeps the NAT mappings of quiet
    /// connections alive. A dead peer still ends in the idle timeout (only
    /// the first PING after hearing from the peer restarts the idle timer).
    /// `None`: never.
    pub keepalive: Option<Duration>,
    /// Per-stream and per-connection receive windows (bytes).
    pub stream_window: u64,
    pub connection_window: u64,
    pub max_streams_bidi: u64,
    pub max_streams_uni: u64,
    /// Enable DATAGRAM frames, with this many queued each way.
    pub datagram_queue: Option<usize>,
    /// Congestion control by quiche's name: "cubic", "reno", "bbr2".
    pub congestion_control: String,
    pub pacing: bool,
    /// Servers: answer a first Initial with a Retry to prove the client's
    /// address before keeping any state for it.
    pub retry: bool,
    /// Servers: handshakes in progress at most. When they are all taken,
    /// the oldest is dropped for a newcomer that would take a slot (one
    /// whose address is validated, with `retry`) once it has been in
    /// progress for a second (an honest one takes a few round trips),
    /// else the newcomer's Initial is dropped.
    pub max_handshakes: usize,
    /// Servers: handshakes in progress from one IP address at most, so
    /// that one host (whose address a Retry proves) cannot take every
    /// slot; past it, that address's oldest makes room as above. Clients
    /// behind one NAT share it. Without `retry` an address can be
    /// spoofed, and so can its share.
    pub max_handshakes_per_ip: usize,
    /// Servers: an accepted connection not established this long after
    /// its first Initial is dropped, whatever the idle timeout (which may
    /// be off), so a client that went away, or a spoofed one, cannot hold
    /// a handshake slot for good. Zero: never. The default is a Retry
    /// token's lifetime: a client on a lossy path still retrying its
    /// handshake is not cut off while its token would still be taken.
    pub handshake_timeout: Duration,
    /// Servers: connections at most.
    pub max_connections: usize,
}

impl Default for QuicConfig {
    fn default() -> Self {
        QuicConfig {
            alpn: vec![ALPN.to_vec()],
            cert_chain: None,
            private_key: None,
            trust: Trust::InsecureNoVerify,
            max_udp_payload: 1472,
            discover_pmtu: true,
            idle_timeout: Duration::from_secs(30),
            keepalive: Some(Duration::from_secs(1)),
            stream_window: 16 << 20,
            connection_window: 64 << 20,
            max_streams_bidi: 1024,
            max_streams_uni: 1024,
            datagram_queue: Some(1024),
            congestion_control: "cubic".to_owned(),
            pacing: false,
            retry: true,
            max_handshakes: 256,
            max_handshakes_per_ip: 16,
            handshake_timeout: super::token::TOKEN_LIFETIME,
            max_connections: 16 * 1024,
        }
    }
}

impl QuicConfig {
    /// A node of a cluster: mutual TLS with the cluster's CA.
    pub fn cluster_node(files: &NodeFiles) -> QuicConfig {
        QuicConfig {
            cert_chain: Some(files.cert.clone()),
            private_key: Some(files.key.clone()),
            trust: Trust::ClusterCa(files.ca.clone()),
            ..QuicConfig::default()
        }
    }

    /// quiche's configuration for one side. `max_payload` is what the
    /// device carries in one datagram.
    pub(crate) fn build(
        &self,
        server: bool,
        max_payload: usize,
    ) -> Result<quiche::Config, QuicError> {
        let mut c = quiche::Config::new(quiche::PROTOCOL_VERSION)?;
        let alpn: Vec<&[u8]> = self.alpn.iter().map(Vec::as_slice).collect();
        c.set_application_protos(&alpn)?;
        if let Some(chain) = &self.cert_chain {
            c.load_cert_chain_from_pem_file(path_str(chain)?)
                .map_err(|_| QuicError::Certificate(chain.clone()))?;
        } else if server || matches!(self.trust, Trust::ClusterCa(_)) {
            return Err(QuicError::MissingIdentity);
        }
        if let Some(key) = &self.private_key {
            c.load_priv_key_from_pem_file(path_str(key)?)
                .map_err(|_| QuicError::Certificate(key.clone()))?;
        }
        match &self.trust {
            Trust::ClusterCa(ca) => {
                c.load_verify_locations_from_file(path_str(ca)?)
                    .map_err(|_| QuicError::Certificate(ca.clone()))?;
                c.verify_peer(true);
            }
            Trust::InsecureNoVerify => c.verify_peer(false),
        }
        let payload = self.max_udp_payload.min(max_payload);
        c.set_max_recv_udp_payload_size(payload);
        c.set_max_send_udp_payload_size(payload);
        c.discover_pmtu(self.discover_pmtu);
        c.set_max_idle_timeout(self.idle_timeout.as_millis() as u64);
        c.set_initial_max_data(self.connection_window);
        c.set_initial_max_stream_data_bidi_local(self.stream_window);
        c.set_initial_max_stream_data_bidi_remote(self.stream_window);
        c.set_initial_max_stream_data_uni(self.stream_window);
        c.set_initial_max_streams_bidi(self.max_streams_bidi);
        c.set_initial_max_streams_uni(self.max_streams_uni);
        c.set_max_connection_window(self.connection_window.max(24 << 20));
        c.set_max_stream_window(self.stream_window.max(16 << 20));
        c.set_disable_active_migration(true);
        c.set_active_connection_id_limit(PATHS_PER_CONNECTION);
        if let Some(queue) = self.datagram_queue {
            c.enable_dgram(true, queue, queue);
        }
        c.set_cc_algorithm_name(&self.congestion_control)
            .map_err(|_| QuicError::UnknownCongestionControl(self.congestion_control.clone()))?;
        c.enable_pacing(self.pacing);
        Ok(c)
    }
}

/// The path as BoringSSL takes it, once it is known to exist: a missing
/// file says so, rather than that it is not PEM.
fn path_str(p: &std::path::Path) -> Result<&str, QuicError> {
    if std::fs::metadata(p).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Err(QuicError::MissingFile(p.to_owned()));
    }
    p.to_str()
        .ok_or_else(|| QuicError::Certificate(p.to_owned()))
}
