//! One lcore's QUIC endpoint: a connection table keyed by connection ID,
//! server accept (with Retry and a handshake limit) and client connect,
//! timers, pacing, and the stream / datagram API for the layers above.
//!
//! The endpoint does no I/O of its own: `recv` takes datagrams from a
//! backend, `send` fills buffers the backend allocated, and `drive` does
//! one round of both. Call `drive` (or the three steps) from the lcore's
//! loop; application work goes between calls.

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use quiche::ConnectionId;
use rand::SeedableRng;
use tracing::{debug, info, warn};

use super::cid::{new_cid, owner_lcore, CID_LEN};
use super::config::{QuicConfig, Trust};
use super::shared_buf::{SharedBuf, SharedBufFactory};
use super::stall::{self, Delivery, StallWatch};
use super::token::TokenKey;
use super::QuicError;
use crate::io::impair::DelayQueue;
use crate::io::{Datagram, PacketIo};

/// Datagrams taken from the backend per `drive`, at most.
const RX_BURST: usize = 32;
/// Bytes taken from the backend per `drive`, about: quiche copies every
/// STREAM frame out of its datagram, and the copies should still be in
/// cache when the application reads them after `drive`. With 32 KiB
/// datagrams (kernel UDP on loopback) 8 per turn gave a 2-rank all-reduce
/// 1.15-1.35x the bandwidth of 32 per turn, and 2 or 16 less than 8.
const RX_BYTES_PER_DRIVE: usize = 256 << 10;
/// Datagrams waiting for the device at most; beyond this the endpoint stops
/// asking quiche for more (quiche keeps the data and retransmits as needed,
/// so this is backpressure, not loss).
const MAX_TX_PENDING: usize = 256;
/// Packets held back for pacing at most.
const MAX_PACED: usize = 1024;
/// TLS alert certificate_required (116) as a QUIC CRYPTO_ERROR (0x100 + alert).
const CERTIFICATE_REQUIRED: u64 = 0x100 + 116;

/// A connection of this endpoint. Stays valid (and unique) after the
/// connection closes; calls on it then fail with `NoConnection`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnHandle(u64);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// Closed by this side (`close`, or a protocol error found here).
    Local {
        app: bool,
        code: u64,
        reason: Vec<u8>,
    },
    /// Closed by the peer.
    Peer {
        app: bool,
        code: u64,
        reason: Vec<u8>,
    },
    /// No packet from the peer within the idle timeout.
    IdleTimeout,
    /// An accepted connection not established within
    /// `QuicConfig::handshake_timeout`: dropped, no close sent.
    HandshakeTimeout,
    /// An accepted connection dropped while still handshaking, after
    /// `HANDSHAKE_GRACE`, to make room for a newcomer when
    /// `QuicConfig::max_handshakes` (or its address's
    /// `max_handshakes_per_ip`) were taken; no close sent.
    HandshakeEvicted,
    /// Closed here: no progress for the idle timeout (counted from the
    /// first probe timeout; what we sent was lost, hardly any of it
    /// acknowledged), though the peer may still be heard. See `stall`.
    Stalled { for_ms: u64 },
    /// Refused here: the peer did not prove cluster membership.
    Refused(&'static str),
}

impl CloseReason {
    /// The TLS alert behind a CRYPTO_ERROR close (QUIC codes 0x100-0x1ff
    /// carry one, RFC 9001 section 4.8), from either side.
    pub fn tls_alert(&self) -> Option<u8> {
        match self {
            CloseReason::Local {
                app: false, code, ..
            }
            | CloseReason::Peer {
                app: false, code, ..
            } if (0x100..=0x1ff).contains(code) => Some((code - 0x100) as u8),
            _ => None,
        }
    }

    /// Whether certificates are the likely cause: a certificate alert
    /// (bad, unsupported, revoked, expired, unknown, unknown CA, a
    /// signature that does not verify, one required), or a peer refused
    /// here for lack of cluster membership. Not for other TLS alerts (a
    /// protocol or ALPN mismatch, an internal error).
    pub fn is_certificate_trouble(&self) -> bool {
        matches!(self.tls_alert(), Some(42..=46 | 48 | 51 | 116))
            || matches!(self, CloseReason::Refused(_))
    }
}

/// Names of the TLS alerts a handshake between cluster nodes can end in.
fn alert_name(alert: u8) -> &'static str {
    match alert {
        40 => "handshake_failure",
        42 => "bad_certificate",
        43 => "unsupported_certificate",
        44 => "certificate_revoked",
        45 => "certificate_expired",
        46 => "certificate_unknown",
        48 => "unknown_ca",
        51 => "decrypt_error",
        70 => "protocol_version",
        80 => "internal_error",
        116 => "certificate_required",
        120 => "no_application_protocol",
        _ => "other",
    }
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let detail = |f: &mut std::fmt::Formatter<'_>, app: bool, code: u64, reason: &[u8]| {
            match (app, self.tls_alert()) {
                (true, _) => write!(f, "application error {code}")?,
                (false, Some(a)) => write!(f, "TLS alert {a} ({})", alert_name(a))?,
                (false, None) => write!(f, "transport error {code:#x}")?,
            }
            if !reason.is_empty() {
                write!(f, ": {}", String::from_utf8_lossy(reason))?;
            }
            Ok(())
        };
        match self {
            CloseReason::Local { app, code, reason } => {
                f.write_str("closed here with ")?;
                detail(f, *app, *code, reason)
            }
            CloseReason::Peer { app, code, reason } => {
                f.write_str("closed by the peer with ")?;
                detail(f, *app, *code, reason)
            }
            CloseReason::IdleTimeout => {
                f.write_str("no packet from the peer within the idle timeout")
            }
            CloseReason::HandshakeTimeout => {
                f.write_str("handshake not done within the handshake timeout")
            }
            CloseReason::HandshakeEvicted => f.write_str(
                "handshake dropped for a newer one: every handshake slot was taken \
                 (max_handshakes, or its address's max_handshakes_per_ip) and this one \
                 had been in progress longest",
            ),
            CloseReason::Stalled { for_ms } => write!(
                f,
                "no progress for {for_ms} ms: what was sent was lost, not acknowledged (a path \
                 that drops our packets, too big for it with path MTU discovery off?)"
            ),
            CloseReason::Refused(why) => write!(f, "refused: {why}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Established {
        conn: ConnHandle,
        peer: SocketAddrV4,
        alpn: Vec<u8>,
    },
    Closed {
        conn: ConnHandle,
        peer: SocketAddrV4,
        /// Whether the handshake had completed.
        established: bool,
        reason: CloseReason,
    },
}

/// What happened at the endpoint, beyond any one connection.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EndpointStats {
    pub datagrams_in: u64,
    pub datagrams_out: u64,
    /// Received datagrams that are not QUIC packets at all.
    pub junk: u64,
    /// Packets for connections we do not have (and not an Initial).
    pub unknown_connection: u64,
    pub version_negotiations: u64,
    pub retries_sent: u64,
    /// Initials with a token that is forged, expired or for another address.
    pub bad_tokens: u64,
    /// Initials dropped because too many handshakes were in progress.
    pub handshake_limited: u64,
    /// Initials dropped because too many handshakes from their IP address
    /// were in progress (`QuicConfig::max_handshakes_per_ip`).
    pub handshake_limited_per_ip: u64,
    /// Handshakes dropped for a newcomer (`CloseReason::HandshakeEvicted`).
    pub handshakes_evicted: u64,
    /// Initials for a new connection in datagrams under 1200 bytes,
    /// dropped (RFC 9000 section 14.1).
    pub short_initials: u64,
    /// Accepted connections whose handshake failed or expired
    /// (`QuicConfig::handshake_timeout`); logged at debug level only.
    pub handshakes_failed: u64,
    pub accepted: u64,
    pub connected: u64,
    /// Peers refused for lack of a cluster certificate.
    pub refused: u64,
    pub closed: u64,
    /// Buffers the backend could not allocate when quiche had data.
    pub alloc_failures: u64,
    /// Connections closed here whose close could not be sent (see
    /// `CLOSE_DATAGRAMS`): dropped, the peer times out.
    pub closes_unsent: u64,
    /// Connections that stalled at their discovered path size and had it
    /// checked again (see `stall`).
    pub pmtu_rechecks: u64,
    /// Connections closed here after a stall as long as the idle timeout
    /// (see `stall`).
    pub stalls: u64,
    /// PINGs sent by connections that had sent nothing for
    /// `QuicConfig::keepalive`.
    pub keepalives: u64,
}

/// A connection's transport statistics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnStats {
    pub rtt: Duration,
    pub cwnd: usize,
    pub packets_sent: usize,
    pub packets_received: usize,
    pub packets_lost: usize,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub bytes_lost: u64,
    /// The largest UDP payload it sends now: what path MTU discovery has
    /// found so far (1200 bytes until a probe is acknowledged).
    pub max_datagram: usize,
}

/// Our connections keep stream data as `SharedBuf`s (zero-copy sends).
pub type Connection = quiche::Connection<SharedBufFactory>;

struct Conn {
    q: Connection,
    peer: SocketAddrV4,
    local_port: u16,
    established: bool,
    server: bool,
    next_bidi: u64,
    next_uni: u64,
    /// Our IDs for this connection in `by_cid`, removed when it closes.
    cids: Vec<CidKey>,
    refused: Option<&'static str>,
    /// After `close`: datagrams it may still send before its close frame
    /// is out (see `CLOSE_DATAGRAMS`).
    close_budget: Option<u8>,
    stall: StallWatch,
    /// Set when the endpoint closed the connection for a stall: for how long.
    stalled_for: Option<Duration>,
    /// When the connection last sent a datagram (see `QuicConfig::keepalive`).
    last_sent: Instant,
    /// An accepted connection not established by then is dropped
    /// (`QuicConfig::handshake_timeout`); `None` for our own dials.
    handshake_deadline: Option<Instant>,
    /// While an accepted connection handshakes: the IP address it came
    /// from and when (what `max_handshakes_per_ip` and eviction count).
    handshaking: Option<(Ipv4Addr, Instant)>,
}

/// A connection closed by the application normally sends its close in the
/// next datagram and starts draining. quiche can send an application close
/// only in a 1-RTT packet, though, and a client that closes before the
/// handshake is confirmed while it owes a Handshake ACK gets a Handshake
/// packet from every `send`, without the close, forever (observed: 400,000
/// ACK-only datagrams in 2 s, which flooded the link and stalled other
/// handshakes; cloudflare/quiche issue 1433). Past this many datagrams
/// without draining, the endpoint drops the connection; the peer times out.
const CLOSE_DATAGRAMS: u8 = 8;

/// How long an accepted handshake is safe from eviction when every slot
/// is taken: an honest one is done in a few round trips, so one in
/// progress this long is stalled or an attacker's holding its slot.
pub const HANDSHAKE_GRACE: Duration = Duration::from_secs(1);

/// The smallest datagram a client's first Initial may come in.
const MIN_INITIAL_DATAGRAM: usize = 1200;

pub struct Endpoint<B: Datagram> {
    lcore: u8,
    config: QuicConfig,
    server_config: Option<quiche::Config>,
    client_config: quiche::Config,
    require_client_cert: bool,
    // Looked up for every datagram: aHash (randomly keyed, so peers
    // choosing connection IDs cannot force collisions) instead of SipHash,
    // which took 4% of a receiving core.
    conns: HashMap<u64, Conn, ahash::RandomState>,
    by_cid: HashMap<CidKey, u64, ahash::RandomState>,
    /// Round-robin order for sending, so no connection starves the rest.
    order: Vec<u64>,
    cursor: usize,
    next_handle: u64,
    /// Accepted connections not yet established: what `max_handshakes`
    /// limits (our own dials are the caller's to bound), and how many of
    /// them come from each IP address.
    handshakes: usize,
    handshakes_by_ip: HashMap<Ipv4Addr, usize, ahash::RandomState>,
    /// Their handles in the order they were accepted (also of some that
    /// are done: see `oldest_handshake`).
    handshake_queue: VecDeque<u64>,
    events: VecDeque<Event>,
    tokens: TokenKey,
    paced: DelayQueue<B>,
    rng: rand_chacha::ChaCha8Rng,
    stats: EndpointStats,
    rx: Vec<B>,
    /// Scratch list of connection handles, reused every round.
    scratch: Vec<u64>,
    /// Largest UDP payload a connection sends, before the path to the peer
    /// caps it (see `accept` and `connect_via`).
    max_send: usize,
}

impl<B: Datagram> Endpoint<B> {
    /// An endpoint that only connects out (a client).
    pub fn client(config: QuicConfig, lcore: u8, max_payload: usize) -> Result<Self, QuicError> {
        Self::new(config, lcore, max_payload, false)
    }

    /// An endpoint that accepts connections (and can also connect out).
    pub fn server(config: QuicConfig, lcore: u8, max_payload: usize) -> Result<Self, QuicError> {
        Self::new(config, lcore, max_payload, true)
    }

    fn new(
        config: QuicConfig,
        lcore: u8,
        max_payload: usize,
        accept: bool,
    ) -> Result<Self, QuicError> {
        let server_config = if accept {
            Some(config.build(true, max_payload)?)
        } else {
            None
        };
        let client_config = config.build(false, max_payload)?;
        let max_send = config.max_udp_payload.min(max_payload);
        Ok(Endpoint {
            lcore,
            require_client_cert: matches!(config.trust, Trust::ClusterCa(_)),
            config,
            server_config,
            client_config,
            conns: HashMap::default(),
            by_cid: HashMap::default(),
            order: Vec::new(),
            cursor: 0,
            next_handle: 0,
            handshakes: 0,
            handshakes_by_ip: HashMap::default(),
            handshake_queue: VecDeque::new(),
            events: VecDeque::new(),
            tokens: TokenKey::default(),
            paced: DelayQueue::new(),
            rng: rand_chacha::ChaCha8Rng::from_entropy(),
            stats: EndpointStats::default(),
            rx: Vec::with_capacity(RX_BURST),
            scratch: Vec::new(),
            max_send,
        })
    }

    pub fn stats(&self) -> EndpointStats {
        self.stats
    }

    /// Connections open (handshaking or established).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Accepted connections still handshaking.
    pub fn handshakes_in_progress(&self) -> usize {
        self.handshakes
    }

    /// Packets held back for pacing.
    pub fn paced(&self) -> usize {
        self.paced.len()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// One round: receive a burst, run timers, send what is due.
    /// Returns how many datagrams moved, for the caller's idle backoff.
    pub fn drive<P: PacketIo<Buf = B>>(&mut self, io: &mut P, tx: &mut Vec<B>) -> usize {
        let now = Instant::now();
        let mut rx = std::mem::take(&mut self.rx);
        let max = (RX_BYTES_PER_DRIVE / io.max_payload().max(1)).clamp(1, RX_BURST);
        let got = io.recv_burst(&mut rx, max);
        for d in rx.drain(..) {
            self.recv(d, io, tx);
        }
        self.rx = rx;
        self.on_timers(now);
        self.send(io, tx, now);
        let sent = if tx.is_empty() { 0 } else { io.send_burst(tx) };
        io.poll(now);
        got + sent
    }

    /// Open a connection to `peer` from `local`; `server_name` is checked
    /// against the server's certificate (a node name under a cluster CA).
    /// Its datagrams may be as big as the endpoint's; `connect_via` sizes
    /// them by the path instead.
    pub fn connect(
        &mut self,
        local: SocketAddrV4,
        peer: SocketAddrV4,
        server_name: Option<&str>,
    ) -> Result<ConnHandle, QuicError> {
        self.open(local, peer, server_name, None, self.max_send)
    }

    /// `connect`, with datagrams no bigger than `io`'s route to `peer`
    /// carries (`PacketIo::max_payload_to`), as the server side does for
    /// each connection it accepts. An endpoint made for loopback's big
    /// datagrams can then reach a peer across a 1500-byte link without
    /// losing every full-size packet first (sends are DF).
    pub fn connect_via<P: PacketIo<Buf = B>>(
        &mut self,
        io: &P,
        local: SocketAddrV4,
        peer: SocketAddrV4,
        server_name: Option<&str>,
    ) -> Result<ConnHandle, QuicError> {
        let max_send = io.max_payload_to(peer).min(self.max_send);
        self.open(local, peer, server_name, None, max_send)
    }

    /// `connect`, resuming the TLS session of an earlier connection to the
    /// same server (`session` from `session()`): a shorter handshake.
    pub fn connect_resuming(
        &mut self,
        local: SocketAddrV4,
        peer: SocketAddrV4,
        server_name: Option<&str>,
        session: Option<&[u8]>,
    ) -> Result<ConnHandle, QuicError> {
        self.open(local, peer, server_name, session, self.max_send)
    }

    fn open(
        &mut self,
        local: SocketAddrV4,
        peer: SocketAddrV4,
        server_name: Option<&str>,
        session: Option<&[u8]>,
        max_send: usize,
    ) -> Result<ConnHandle, QuicError> {
        if self.conns.len() >= self.config.max_connections {
            return Err(QuicError::TooManyConnections(self.config.max_connections));
        }
        // Read when the connection is made: each gets its own.
        self.client_config.set_max_send_udp_payload_size(max_send);
        let scid = new_cid(self.lcore, &mut self.rng);
        let mut q = quiche::connect_with_buffer_factory(
            server_name,
            &scid,
            SocketAddr::V4(local),
            SocketAddr::V4(peer),
            &mut self.client_config,
        )?;
        if let Some(session) = session {
            q.set_session(session)?;
        }
        self.stats.connected += 1;
        Ok(self.insert(q, peer, local.port(), scid, false))
    }

    fn insert(
        &mut self,
        q: Connection,
        peer: SocketAddrV4,
        local_port: u16,
        scid: ConnectionId<'static>,
        server: bool,
    ) -> ConnHandle {
        let h = self.next_handle;
        self.next_handle += 1;
        let now = Instant::now();
        let key = CidKey::new(&scid);
        self.by_cid.insert(key, h);
        self.conns.insert(
            h,
            Conn {
                q,
                peer,
                local_port,
                established: false,
                server,
                // Stream IDs: bit 0 = server-initiated, bit 1 = unidirectional.
                next_bidi: if server { 1 } else { 0 },
                next_uni: if server { 3 } else { 2 },
                cids: vec![key],
                refused: None,
                close_budget: None,
                stall: StallWatch::default(),
                stalled_for: None,
                last_sent: now,
                handshake_deadline: Some(self.config.handshake_timeout)
                    .filter(|t| server && !t.is_zero())
                    .and_then(|t| now.checked_add(t)),
                handshaking: server.then_some((*peer.ip(), now)),
            },
        );
        self.order.push(h);
        if server {
            self.handshakes += 1;
            *self.handshakes_by_ip.entry(*peer.ip()).or_default() += 1;
            self.handshake_queue.push_back(h);
        }
        ConnHandle(h)
    }

    /// Feed one received datagram to its connection (or accept a new one).
    pub fn recv<P: PacketIo<Buf = B>>(&mut self, mut d: B, io: &mut P, tx: &mut Vec<B>) {
        self.recv_in_place(&mut d, io, tx);
        io.release(d);
    }

    fn recv_in_place<P: PacketIo<Buf = B>>(&mut self, d: &mut B, io: &mut P, tx: &mut Vec<B>) {
        self.stats.datagrams_in += 1;
        let peer = d.peer();
        let local = SocketAddrV4::new(io.local_ip(), d.local_port());
        if let Some((dcid, scid)) = unsupported_version(d.payload()) {
            self.negotiate_version(&dcid, &scid, d.payload().len(), peer, local, io, tx);
            return;
        }
        let (dcid, initial) = {
            let Ok(hdr) = quiche::Header::from_slice(d.payload_mut(), CID_LEN) else {
                self.stats.junk += 1;
                return;
            };
            let initial = (hdr.ty == quiche::Type::Initial).then(|| owned_initial(&hdr));
            (CidKey::new(&hdr.dcid), initial)
        };
        let h = match self.by_cid.get(&dcid) {
            Some(&h) => h,
            None => match initial {
                // RFC 9000 14.1: a server discards an Initial in a datagram
                // under 1200 bytes (a client pads its own), so a spoofed
                // one cannot draw a larger reply (a Retry) than it is.
                Some(_) if d.payload().len() < MIN_INITIAL_DATAGRAM => {
                    self.stats.short_initials += 1;
                    return;
                }
                Some(init) => match self.accept(&init, &dcid, peer, local, io, tx) {
                    Some(h) => h,
                    None => return,
                },
                None => {
                    self.stats.unknown_connection += 1;
                    return;
                }
            },
        };
        let Some(c) = self.conns.get_mut(&h) else {
            return;
        };
        let info = quiche::RecvInfo {
            from: SocketAddr::V4(peer),
            to: SocketAddr::V4(local),
        };
        match c.q.recv(d.payload_mut(), info) {
            // From elsewhere than the peer's address: a client whose NAT
            // rebound it. quiche moves the connection there once that is
            // its latest packet (and validates the new path).
            Ok(_) if peer != c.peer => follow_active_path(h, c),
            Ok(_) => {}
            Err(e) => debug!(conn = h, %peer, error = %e, "quic recv"),
        }
        self.after_input(h);
    }

    /// A new connection from an Initial, or `None` after answering it
    /// statelessly (version negotiation, Retry) or dropping it.
    fn accept<P: PacketIo<Buf = B>>(
        &mut self,
        init: &OwnedInitial,
        dcid_key: &CidKey,
        peer: SocketAddrV4,
        local: SocketAddrV4,
        io: &mut P,
        tx: &mut Vec<B>,
    ) -> Option<u64> {
        self.server_config.as_ref()?;
        let dcid = ConnectionId::from_vec(dcid_key.as_slice().to_vec());
        // Full, with no handshake that could make room: not even a Retry.
        let now = Instant::now();
        if self.conns.len() >= self.config.max_connections
            || (self.handshakes >= self.config.max_handshakes
                && self.oldest_handshake(None, now).is_none())
        {
            self.stats.handshake_limited += 1;
            return None;
        }
        let (scid, odcid, also_route) = if self.config.retry {
            let validated = match self.tokens.validate(peer, &dcid, &init.token) {
                Some(odcid) if dcid.len() == CID_LEN => Some(odcid),
                _ => None,
            };
            if !init.token.is_empty() && validated.is_none() {
                self.stats.bad_tokens += 1;
            }
            match validated {
                Some(odcid) => (dcid, Some(odcid), None),
                // No token, or one to an ID we did not give (a token from
                // elsewhere: another server's NEW_TOKEN, one from before a
                // restart, whose key is gone): not an answer to a Retry of
                // ours, so it gets one (RFC 9000 8.1.3), as a client
                // dropped for ever would wait out its handshake timeout.
                None if init.token.is_empty() || owner_lcore(&dcid).is_none() => {
                    let new_scid = new_cid(self.lcore, &mut self.rng);
                    let token = self.tokens.mint(peer, &dcid, &new_scid);
                    self.stats.retries_sent += 1;
                    self.reply(io, tx, peer, local.port(), |out| {
                        quiche::retry(&init.scid, &dcid, &new_scid, &token, init.version, out)
                    });
                    return None;
                }
                // An answer to our Retry whose token fails (forged, expired,
                // or from another address: a NAT that rebound the client
                // since): dropped. RFC 9000 8.1.2's INVALID_TOKEN close
                // would take decrypting the Initial, the work Retry spares
                // us for addresses not validated (anyone can send an
                // Initial to an ID of our shape, from any address).
                None => return None,
            }
        } else {
            // Until the client hears from us it resends its Initial to the
            // ID it chose: route that one to the new connection too.
            (new_cid(self.lcore, &mut self.rng), None, Some(*dcid_key))
        };
        // The newcomer takes a slot now (an Initial that only draws a
        // Retry takes none, and makes no room): one of its address's, and
        // one of all.
        if !self.make_room(Some(*peer.ip()), now) {
            self.stats.handshake_limited_per_ip += 1;
            return None;
        }
        if !self.make_room(None, now) {
            self.stats.handshake_limited += 1;
            return None;
        }
        let cfg = self.server_config.as_mut()?;
        // A peer may accept far bigger datagrams than the path to it
        // carries (aioquic offers 65527 bytes): quiche sends up to the
        // smaller of its own limit and the peer's, so ours must be the
        // path's, or every full-size packet is lost on the way.
        cfg.set_max_send_udp_payload_size(io.max_payload_to(peer).min(self.max_send));
        match quiche::accept_with_buf_factory(
            &scid,
            odcid.as_ref(),
            SocketAddr::V4(local),
            SocketAddr::V4(peer),
            cfg,
        ) {
            Ok(q) => {
                self.stats.accepted += 1;
                let h = self.insert(q, peer, local.port(), scid, true).0;
                if let Some(key) = also_route {
                    self.by_cid.insert(key, h);
                    if let Some(c) = self.conns.get_mut(&h) {
                        c.cids.push(key);
                    }
                }
                Some(h)
            }
            Err(e) => {
                debug!(%peer, error = %e, "quic accept");
                None
            }
        }
    }

    /// Answers a long-header packet of a version quiche does not speak
    /// with a Version Negotiation packet, on a server, when its datagram
    /// has an Initial's size (RFC 9000 6.1: smaller ones are dropped, so
    /// a spoofed one draws no bigger reply).
    #[allow(clippy::too_many_arguments)]
    fn negotiate_version<P: PacketIo<Buf = B>>(
        &mut self,
        dcid: &[u8],
        scid: &[u8],
        datagram_len: usize,
        peer: SocketAddrV4,
        local: SocketAddrV4,
        io: &mut P,
        tx: &mut Vec<B>,
    ) {
        if self.server_config.is_none() {
            self.stats.unknown_connection += 1;
            return;
        }
        if datagram_len < MIN_INITIAL_DATAGRAM {
            self.stats.short_initials += 1;
            return;
        }
        self.stats.version_negotiations += 1;
        let (dcid, scid) = (ConnectionId::from_ref(dcid), ConnectionId::from_ref(scid));
        // quiche takes the packet's IDs and swaps them itself.
        self.reply(io, tx, peer, local.port(), |out| {
            quiche::negotiate_version(&scid, &dcid, out)
        });
    }

    /// Send one stateless reply written by `write` into a fresh buffer.
    fn reply<P: PacketIo<Buf = B>>(
        &mut self,
        io: &mut P,
        tx: &mut Vec<B>,
        peer: SocketAddrV4,
        local_port: u16,
        write: impl FnOnce(&mut [u8]) -> quiche::Result<usize>,
    ) {
        if tx.len() >= MAX_TX_PENDING {
            return;
        }
        let Some(mut b) = io.alloc() else {
            self.stats.alloc_failures += 1;
            return;
        };
        let cap = b.capacity();
        b.set_len(cap);
        if let Ok(n) = write(b.payload_mut()) {
            b.set_len(n);
            b.set_peer(peer);
            b.set_local_port(local_port);
            self.stats.datagrams_out += 1;
            tx.push(b);
        }
    }

    /// After packets or timers: report establishment, enforce membership,
    /// reap a closed connection.
    fn after_input(&mut self, h: u64) {
        let require_cert = self.require_client_cert;
        let Some(c) = self.conns.get_mut(&h) else {
            return;
        };
        if !c.established && c.q.is_established() {
            c.established = true;
            end_handshake(c, &mut self.handshakes, &mut self.handshakes_by_ip);
            if c.server && require_cert && c.q.peer_cert().is_none() {
                warn!(peer = %c.peer, "refusing peer: it presented no certificate from the cluster CA");
                c.refused = Some("no client certificate");
                self.stats.refused += 1;
                let _ =
                    c.q.close(false, CERTIFICATE_REQUIRED, b"client certificate required");
            } else {
                self.events.push_back(Event::Established {
                    conn: ConnHandle(h),
                    peer: c.peer,
                    alpn: c.q.application_proto().to_vec(),
                });
            }
        }
        // quiche queues path events until taken: PMTU changes (a handful
        // per discovery), new paths and their validation. Only logged.
        while let Some(e) = c.q.path_event_next() {
            if let quiche::PathEvent::PmtuUpdated { pmtu, .. } = e {
                debug!(conn = h, peer = %c.peer, pmtu, "path MTU discovered");
            }
        }
        if c.q.is_closed() {
            self.reap(h);
        }
    }

    fn reap(&mut self, h: u64) {
        let Some(mut c) = self.conns.remove(&h) else {
            return;
        };
        for cid in &c.cids {
            self.by_cid.remove(cid);
        }
        self.order.retain(|&x| x != h);
        let evicted = c.handshaking.is_some() && c.refused == Some(EVICTED);
        end_handshake(&mut c, &mut self.handshakes, &mut self.handshakes_by_ip);
        let handshake_expired = c.handshake_deadline.is_some_and(|t| t <= Instant::now());
        let reason = if evicted {
            CloseReason::HandshakeEvicted
        } else if let Some(why) = c.refused {
            CloseReason::Refused(why)
        } else if let Some(d) = c.stalled_for {
            CloseReason::Stalled {
                for_ms: d.as_millis() as u64,
            }
        } else if let Some(e) = c.q.peer_error() {
            CloseReason::Peer {
                app: e.is_app,
                code: e.error_code,
                reason: e.reason.clone(),
            }
        } else if let Some(e) = c.q.local_error() {
            CloseReason::Local {
                app: e.is_app,
                code: e.error_code,
                reason: e.reason.clone(),
            }
        } else if handshake_expired && !c.established {
            CloseReason::HandshakeTimeout
        } else {
            CloseReason::IdleTimeout
        };
        if !c.established && reason.is_certificate_trouble() {
            warn!(peer = %c.peer, %reason, "quic handshake failed (is the peer's certificate from the cluster CA?)");
        } else if !c.established && !c.server {
            warn!(peer = %c.peer, %reason, "quic handshake failed");
        } else if !c.established {
            // Anyone can start a handshake (with a spoofed address, too):
            // a line per failure would let them flood the log.
            self.stats.handshakes_failed += 1;
            debug!(peer = %c.peer, %reason, "quic handshake with a client failed");
        }
        self.stats.closed += 1;
        self.events.push_back(Event::Closed {
            conn: ConnHandle(h),
            peer: c.peer,
            established: c.established,
            reason,
        });
    }

    /// Whether an accepted handshake from `ip` (or from anywhere, for
    /// `None`) may start: below its limit, or made so by dropping the one
    /// of them in progress longest, if that has had `HANDSHAKE_GRACE`.
    fn make_room(&mut self, ip: Option<Ipv4Addr>, now: Instant) -> bool {
        let (taken, limit) = match ip {
            Some(ip) => (
                self.handshakes_by_ip.get(&ip).copied().unwrap_or(0),
                self.config.max_handshakes_per_ip,
            ),
            None => (self.handshakes, self.config.max_handshakes),
        };
        if taken < limit {
            return true;
        }
        let Some(h) = self.oldest_handshake(ip, now) else {
            return false;
        };
        if let Some(c) = self.conns.get_mut(&h) {
            c.refused = Some(EVICTED);
        }
        self.stats.handshakes_evicted += 1;
        self.reap(h);
        true
    }

    /// The accepted handshake (from `ip`, or from anywhere) in progress
    /// longest, if that is `HANDSHAKE_GRACE` or more. Handles of
    /// connections no longer handshaking leave the queue's front as they
    /// reach it, and the whole queue when it grows past twice the limit.
    fn oldest_handshake(&mut self, ip: Option<Ipv4Addr>, now: Instant) -> Option<u64> {
        let conns = &self.conns;
        let live = |h: &u64| conns.get(h).and_then(|c| c.handshaking);
        while self
            .handshake_queue
            .front()
            .is_some_and(|h| live(h).is_none())
        {
            self.handshake_queue.pop_front();
        }
        if self.handshake_queue.len() > 2 * self.config.max_handshakes.max(1) {
            self.handshake_queue.retain(|h| live(h).is_some());
        }
        // The queue is by age: the first of `ip`'s is its oldest.
        let (h, since) = self.handshake_queue.iter().find_map(|h| {
            let (from, since) = live(h)?;
            ip.is_none_or(|ip| ip == from).then_some((*h, since))
        })?;
        (now.saturating_duration_since(since) >= HANDSHAKE_GRACE).then_some(h)
    }

    /// Fire the connections' loss-recovery and idle timers that are due,
    /// and their keepalives.
    pub fn on_timers(&mut self, now: Instant) {
        let keepalive = self.config.keepalive;
        let stall_limit = self.stall_limit();
        let mut due = std::mem::take(&mut self.scratch);
        let mut expired = Vec::new();
        for (&h, c) in self.conns.iter_mut() {
            if handshake_due(c).is_some_and(|t| t <= now) {
                expired.push(h);
                continue;
            }
            let ping = keepalive.and_then(|every| keepalive_due(c, every));
            if ping.is_some_and(|t| t <= now) {
                // Goes out with the connection's next packet.
                if c.q.send_ack_eliciting().is_ok() {
                    self.stats.keepalives += 1;
                }
                c.last_sent = now;
            }
            let give_up = stall_limit.and_then(|limit| stall_deadline(c, limit));
            if give_up.is_some_and(|t| t <= now) && end_if_stalled(h, c, now) {
                self.stats.stalls += 1;
            }
            if c.q.timeout_instant().is_some_and(|t| t <= now) {
                due.push(h);
            }
        }
        for &h in &due {
            if let Some(c) = self.conns.get_mut(&h) {
                c.q.on_timeout();
                if recheck_path_size(h, c, now) {
                    self.stats.pmtu_rechecks += 1;
                }
            }
            self.after_input(h);
        }
        due.clear();
        self.scratch = due;
        for h in expired {
            self.reap(h);
        }
    }

    /// How long a connection may stall before it is closed: the idle
    /// timeout, when there is one (see `stall`).
    fn stall_limit(&self) -> Option<Duration> {
        Some(self.config.idle_timeout).filter(|t| !t.is_zero())
    }

    /// The earliest time `on_timers` or paced sending has work.
    pub fn next_timeout(&self) -> Option<Instant> {
        let keepalive = self.config.keepalive;
        let stall_limit = self.stall_limit();
        let conns = self
            .conns
            .values()
            .flat_map(|c| {
                [
                    c.q.timeout_instant(),
                    keepalive.and_then(|k| keepalive_due(c, k)),
                    stall_limit.and_then(|limit| stall_deadline(c, limit)),
                    handshake_due(c),
                ]
            })
            .flatten()
            .min();
        match (conns, self.paced.next_release()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Move packets from the connections into `tx`: paced packets that are
    /// due first, then up to `send_quantum()` per connection, round robin.
    pub fn send<P: PacketIo<Buf = B>>(&mut self, io: &mut P, tx: &mut Vec<B>, now: Instant) {
        self.paced.release(now, tx);
        let n = self.order.len();
        let mut closed = std::mem::take(&mut self.scratch);
        for i in 0..n {
            if tx.len() >= MAX_TX_PENDING || self.paced.len() >= MAX_PACED {
                break;
            }
            let h = self.order[(self.cursor + i) % n];
            // A connection that sent its last packet (or failed) is done.
            if self.send_conn(h, io, tx, now) {
                closed.push(h);
            }
        }
        if n > 0 {
            self.cursor = (self.cursor + 1) % n;
        }
        for &h in &closed {
            self.reap(h);
        }
        closed.clear();
        self.scratch = closed;
    }

    /// Returns whether the connection is closed afterwards.
    fn send_conn<P: PacketIo<Buf = B>>(
        &mut self,
        h: u64,
        io: &mut P,
        tx: &mut Vec<B>,
        now: Instant,
    ) -> bool {
        let Some(c) = self.conns.get_mut(&h) else {
            return false;
        };
        let quantum = c.q.send_quantum().max(1);
        let mut bytes = 0;
        while bytes < quantum && tx.len() < MAX_TX_PENDING {
            let Some(mut b) = io.alloc() else {
                self.stats.alloc_failures += 1;
                break;
            };
            let cap = b.capacity();
            b.set_len(cap);
            match c.q.send(b.payload_mut()) {
                Ok((len, info)) => {
                    b.set_len(len);
                    // Where quiche sends it: the peer's address, or after a
                    // NAT rebinding, its new one (PATH_CHALLENGEs first).
                    b.set_peer(v4(info.to).unwrap_or(c.peer));
                    b.set_local_port(c.local_port);
                    bytes += len;
                    self.stats.datagrams_out += 1;
                    c.last_sent = now;
                    if let Some(left) = c.close_budget.as_mut().filter(|_| !c.q.is_draining()) {
                        *left = left.saturating_sub(1);
                    }
                    if info.at > now + Duration::from_micros(50) {
                        self.paced.push(info.at, b);
                    } else {
                        tx.push(b);
                    }
                }
                Err(quiche::Error::Done) => {
                    io.release(b);
                    break;
                }
                Err(e) => {
                    debug!(conn = h, error = %e, "quic send");
                    io.release(b);
                    break;
                }
            }
            if c.close_budget == Some(0) {
                break;
            }
        }
        if c.close_budget == Some(0) && !c.q.is_draining() {
            self.stats.closes_unsent += 1;
            warn!(conn = h, peer = %c.peer, "quic close could not be sent before the handshake was confirmed; connection dropped");
            return true;
        }
        c.q.is_closed()
    }

    fn conn(&mut self, h: ConnHandle) -> Result<&mut Conn, QuicError> {
        self.conns.get_mut(&h.0).ok_or(QuicError::NoConnection)
    }

    pub fn is_established(&self, h: ConnHandle) -> bool {
        self.conns.get(&h.0).is_some_and(|c| c.established)
    }

    /// The TLS session to resume later (clients, once established and the
    /// server's ticket arrived).
    pub fn session(&self, h: ConnHandle) -> Option<Vec<u8>> {
        self.conns.get(&h.0)?.q.session().map(<[u8]>::to_vec)
    }

    /// The DNS names of the certificate the peer presented
    /// ([`certs::dns_names`](super::certs::dns_names)); empty when it
    /// presented none. Under `Trust::ClusterCa` the CA vouched for them.
    pub fn peer_names(&self, h: ConnHandle) -> Vec<String> {
        self.conns
            .get(&h.0)
            .and_then(|c| c.q.peer_cert())
            .map(super::certs::dns_names)
            .unwrap_or_default()
    }

    /// Whether the handshake resumed an earlier session.
    pub fn is_resumed(&self, h: ConnHandle) -> bool {
        self.conns.get(&h.0).is_some_and(|c| c.q.is_resumed())
    }

    pub fn peer(&self, h: ConnHandle) -> Option<SocketAddrV4> {
        self.conns.get(&h.0).map(|c| c.peer)
    }

    /// A new bidirectional stream of ours (it exists for the peer once
    /// data or FIN is sent on it).
    pub fn open_bidi(&mut self, h: ConnHandle) -> Result<u64, QuicError> {
        let c = self.conn(h)?;
        let id = c.next_bidi;
        c.next_bidi += 4;
        Ok(id)
    }

    /// A new unidirectional stream of ours.
    pub fn open_uni(&mut self, h: ConnHandle) -> Result<u64, QuicError> {
        let c = self.conn(h)?;
        let id = c.next_uni;
        c.next_uni += 4;
        Ok(id)
    }

    /// Queue bytes on a stream; returns how many were taken (0 when flow
    /// control or the send buffer is full: try again after `drive`).
    pub fn stream_send(
        &mut self,
        h: ConnHandle,
        stream: u64,
        data: &[u8],
        fin: bool,
    ) -> Result<usize, QuicError> {
        match self.conn(h)?.q.stream_send(stream, data, fin) {
            Ok(n) => Ok(n),
            Err(quiche::Error::Done) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Queue `data` on a stream without copying it: quiche keeps the
    /// buffer until the peer has it. Returns what did not fit (None: all
    /// of it was taken); offer that again after `drive`.
    pub fn stream_send_shared(
        &mut self,
        h: ConnHandle,
        stream: u64,
        data: SharedBuf,
        fin: bool,
    ) -> Result<Option<SharedBuf>, QuicError> {
        match self.conn(h)?.q.stream_send_zc(stream, data.clone(), fin) {
            Ok((_, rest)) => Ok(rest),
            Err(quiche::Error::Done) => Ok(Some(data)),
            Err(e) => Err(e.into()),
        }
    }

    /// Read from a stream: `Some((n, fin))`, or `None` when nothing is
    /// readable now.
    pub fn stream_recv(
        &mut self,
        h: ConnHandle,
        stream: u64,
        buf: &mut [u8],
    ) -> Result<Option<(usize, bool)>, QuicError> {
        match self.conn(h)?.q.stream_recv(stream, buf) {
            Ok(r) => Ok(Some(r)),
            Err(quiche::Error::Done) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Streams with data (or a FIN) to read; streams the peer opened show
    /// up here first, which is how they are accepted.
    pub fn readable(&mut self, h: ConnHandle) -> Result<quiche::StreamIter, QuicError> {
        Ok(self.conn(h)?.q.readable())
    }

    /// Streams that can take more data.
    pub fn writable(&mut self, h: ConnHandle) -> Result<quiche::StreamIter, QuicError> {
        Ok(self.conn(h)?.q.writable())
    }

    pub fn stream_finished(&mut self, h: ConnHandle, stream: u64) -> Result<bool, QuicError> {
        Ok(self.conn(h)?.q.stream_finished(stream))
    }

    /// Send an unreliable DATAGRAM frame; `Ok(false)` when the queue is full.
    pub fn dgram_send(&mut self, h: ConnHandle, data: &[u8]) -> Result<bool, QuicError> {
        match self.conn(h)?.q.dgram_send(data) {
            Ok(()) => Ok(true),
            Err(quiche::Error::Done) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    pub fn dgram_recv(
        &mut self,
        h: ConnHandle,
        buf: &mut [u8],
    ) -> Result<Option<usize>, QuicError> {
        match self.conn(h)?.q.dgram_recv(buf) {
            Ok(n) => Ok(Some(n)),
            Err(quiche::Error::Done) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Largest DATAGRAM payload the connection can send now.
    pub fn dgram_max_len(&mut self, h: ConnHandle) -> Result<Option<usize>, QuicError> {
        Ok(self.conn(h)?.q.dgram_max_writable_len())
    }

    /// Close with an application error code; the peer sees `code` and
    /// `reason`. The connection drains, then a `Closed` event follows.
    pub fn close(&mut self, h: ConnHandle, code: u64, reason: &[u8]) -> Result<(), QuicError> {
        app_close(self.conn(h)?, code, reason)
    }

    /// Closes every connection not closing already with application code
    /// `code` (a stopping endpoint: its peers hear it now rather than at
    /// their idle timeout, or never without one).
    pub fn close_all(&mut self, code: u64, reason: &[u8]) {
        for c in self.conns.values_mut().filter(|c| !is_closing(c)) {
            let _ = app_close(c, code, reason);
        }
    }

    /// Since when the connection has made no progress (what it sent was
    /// lost, hardly any of it acknowledged), counted from its first probe
    /// timeout without progress; `None` while it makes progress (or has
    /// nothing in flight). See `stall`.
    pub fn stalled_since(&self, h: ConnHandle) -> Option<Instant> {
        let c = self.conns.get(&h.0)?;
        c.stall.stalled_since(delivery(&c.q))
    }

    pub fn conn_stats(&mut self, h: ConnHandle) -> Result<ConnStats, QuicError> {
        let q = &self.conn(h)?.q;
        let s = q.stats();
        // The path in use: after a peer moved, the first is its old one.
        let path = q.path_stats().find(|p| p.active);
        Ok(ConnStats {
            rtt: path.as_ref().map(|p| p.rtt).unwrap_or_default(),
            cwnd: path.as_ref().map(|p| p.cwnd).unwrap_or_default(),
            packets_sent: s.sent,
            packets_received: s.recv,
            packets_lost: s.lost,
            bytes_sent: s.sent_bytes,
            bytes_received: s.recv_bytes,
            bytes_lost: s.lost_bytes,
            max_datagram: q.max_send_udp_payload_size(),
        })
    }

    /// quiche's connection, for what this API does not cover.
    pub fn connection_mut(&mut self, h: ConnHandle) -> Option<&mut Connection> {
        self.conns.get_mut(&h.0).map(|c| &mut c.q)
    }
}

/// What `accept` needs from an Initial's header, copied out so the packet
/// buffer can be handed to quiche afterwards.
/// The destination and source IDs of a long-header packet whose version
/// is neither 0 (Version Negotiation) nor one quiche speaks, read from
/// the invariant header alone (RFC 8999): past the IDs a version may lay
/// out its header as it likes, and its IDs may be up to 255 bytes.
fn unsupported_version(p: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    if p.first()? & 0x80 == 0 {
        return None;
    }
    let version = u32::from_be_bytes(p.get(1..5)?.try_into().ok()?);
    if version == 0 || quiche::version_is_supported(version) {
        return None;
    }
    let dcid_len = *p.get(5)? as usize;
    let dcid = p.get(6..6 + dcid_len)?;
    let scid_len = *p.get(6 + dcid_len)? as usize;
    let scid = p.get(7 + dcid_len..7 + dcid_len + scid_len)?;
    Some((dcid.to_vec(), scid.to_vec()))
}

struct OwnedInitial {
    version: u32,
    scid: ConnectionId<'static>,
    token: Vec<u8>,
}

fn owned_initial(hdr: &quiche::Header) -> OwnedInitial {
    OwnedInitial {
        version: hdr.version,
        scid: ConnectionId::from_vec(hdr.scid.to_vec()),
        token: hdr.token.clone().unwrap_or_default(),
    }
}

/// What a connection has had acknowledged and lost, and its active path's
/// probe timeouts: what `StallWatch` measures progress by.
fn progress(c: &Conn) -> (Delivery, usize) {
    let ptos =
        c.q.path_stats()
            .find(|p| p.active)
            .map_or(0, |p| p.total_pto_count);
    (delivery(&c.q), ptos)
}

fn delivery(q: &Connection) -> Delivery {
    let s = q.stats();
    Delivery {
        acked: s.acked_bytes,
        lost: s.lost_bytes,
    }
}

/// After a connection's timers ran: if it has stalled (see `stall`),
/// check its path size again. Returns whether it did.
fn recheck_path_size(h: u64, c: &mut Conn, now: Instant) -> bool {
    let (delivered, ptos) = progress(c);
    if !c.stall.observe(delivered, ptos, now) {
        return false;
    }
    info!(conn = h, peer = %c.peer, ptos, "no progress over {} probe timeouts: checking the path's size again", stall::PTOS);
    c.q.revalidate_pmtu();
    true
}

/// When a connection not already closing has been stalled for `limit`,
/// as of its last timers.
fn stall_deadline(c: &Conn, limit: Duration) -> Option<Instant> {
    if is_closing(c) {
        return None;
    }
    c.stall.started().map(|t| t + limit)
}

/// At a connection's stall deadline: closes it if it has made no progress
/// since the stall began (quiche would retransmit forever while the
/// peer's own packets keep its idle timer going). Returns whether it did.
fn end_if_stalled(h: u64, c: &mut Conn, now: Instant) -> bool {
    let (delivered, ptos) = progress(c);
    // Takes in acknowledgements since the last timers (they end the stall).
    c.stall.observe(delivered, ptos, now);
    let Some(since) = c.stall.stalled_since(delivered) else {
        return false;
    };
    let stalled_for = now.saturating_duration_since(since);
    warn!(conn = h, peer = %c.peer, ?stalled_for, ptos, "closing: no progress, what we send is lost (a path that drops our packets?)");
    c.stalled_for = Some(stalled_for);
    c.close_budget.get_or_insert(CLOSE_DATAGRAMS);
    // NO_ERROR: the transport's codes name protocol faults, not this.
    let _ = c.q.close(false, 0x0, b"stalled: no progress");
    true
}

/// Closes `c` with application code `code`, giving its close
/// `CLOSE_DATAGRAMS` to go out.
fn app_close(c: &mut Conn, code: u64, reason: &[u8]) -> Result<(), QuicError> {
    c.close_budget.get_or_insert(CLOSE_DATAGRAMS);
    match c.q.close(true, code, reason) {
        Ok(()) | Err(quiche::Error::Done) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `Conn::refused` of a handshake dropped for a newcomer.
const EVICTED: &str = "evicted";

/// Ends connection `c`'s accepted handshake, if it has one in progress,
/// in the counts that limit them.
fn end_handshake(
    c: &mut Conn,
    handshakes: &mut usize,
    by_ip: &mut HashMap<Ipv4Addr, usize, ahash::RandomState>,
) {
    let Some((ip, _)) = c.handshaking.take() else {
        return;
    };
    *handshakes -= 1;
    if let Some(n) = by_ip.get_mut(&ip) {
        *n -= 1;
        if *n == 0 {
            by_ip.remove(&ip);
        }
    }
}

/// When an accepted connection that is still handshaking is dropped:
/// without an idle timeout (the collectives run without one) nothing else
/// would end a handshake whose client went away or never existed (a
/// spoofed address), and each holds one of `max_handshakes` for good.
/// Dropped without a close: there is no session to close, and a close to
/// a spoofed address is wasted.
fn handshake_due(c: &Conn) -> Option<Instant> {
    c.handshake_deadline.filter(|_| !c.established)
}

/// When an established connection that is not closing owes its peer a
/// keepalive PING.
fn keepalive_due(c: &Conn, every: Duration) -> Option<Instant> {
    (c.established && !is_closing(c)).then(|| c.last_sent + every)
}

/// Closed by the application or the endpoint, or by quiche (draining,
/// closed): no keepalive, no stall check.
fn is_closing(c: &Conn) -> bool {
    c.close_budget.is_some() || c.q.is_draining() || c.q.is_closed()
}

/// The connection's peer is where quiche's active path leads (sends go
/// where quiche addresses each packet; this keeps `Endpoint::peer` and the
/// logs right).
fn follow_active_path(h: u64, c: &mut Conn) {
    let active =
        c.q.path_stats()
            .find(|p| p.active)
            .and_then(|p| v4(p.peer_addr));
    if let Some(to) = active.filter(|&to| to != c.peer) {
        info!(conn = h, from = %c.peer, %to, "peer moved to a new address");
        c.peer = to;
    }
}

/// Our addresses are IPv4; quiche hands them back as `SocketAddr`.
fn v4(a: SocketAddr) -> Option<SocketAddrV4> {
    match a {
        SocketAddr::V4(a) => Some(a),
        SocketAddr::V6(_) => None,
    }
}

/// A connection ID as a map key, inline (IDs are at most 20 bytes), so
/// routing a packet allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct CidKey {
    len: u8,
    bytes: [u8; quiche::MAX_CONN_ID_LEN],
}

impl CidKey {
    fn new(id: &[u8]) -> CidKey {
        let len = id.len().min(quiche::MAX_CONN_ID_LEN);
        let mut bytes = [0; quiche::MAX_CONN_ID_LEN];
        bytes[..len].copy_from_slice(&id[..len]);
        CidKey {
            len: len as u8,
            bytes,
        }
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::CloseReason;

    #[test]
    fn close_reasons_read_as_words_and_name_tls_alerts() {
        let unknown_ca = CloseReason::Local {
            app: false,
            code: 0x100 + 48,
            reason: Vec::new(),
        };
        assert_eq!(
            unknown_ca.to_string(),
            "closed here with TLS alert 48 (unknown_ca)"
        );
        assert!(unknown_ca.is_certificate_trouble());
        let app = CloseReason::Peer {
            app: true,
            code: 304,
            reason: b"bye".to_vec(),
        };
        // An application code in the CRYPTO_ERROR range is not an alert.
        assert_eq!(
            app.to_string(),
            "closed by the peer with application error 304: bye"
        );
        assert!(!app.is_certificate_trouble());
        let transport = CloseReason::Peer {
            app: false,
            code: 0x7,
            reason: Vec::new(),
        };
        assert_eq!(
            transport.to_string(),
            "closed by the peer with transport error 0x7"
        );
        assert!(!CloseReason::IdleTimeout.is_certificate_trouble());
        assert!(CloseReason::Refused("no client certificate").is_certificate_trouble());
        // A foreign CA of the same name fails the signature (decrypt_error);
        // an ALPN mismatch is no certificate's fault.
        let alert = |a: u64| CloseReason::Peer {
            app: false,
            code: 0x100 + a,
            reason: Vec::new(),
        };
        assert!(alert(51).is_certificate_trouble());
        assert!(alert(116).is_certificate_trouble());
        assert!(!alert(120).is_certificate_trouble());
        assert!(!alert(80).is_certificate_trouble());
    }
}
