//! Kernel UDP sockets backend: one non-blocking IPv4 UDP socket, `recvmmsg`
//! through `quinn-udp` with UDP GRO on receive, `sendmmsg` through `nix`
//! with UDP GSO on send; no `unsafe` in this crate.
//!
//! Notes on behaviour:
//! - `recv_burst` makes at most one `recvmmsg` call per invocation over up to
//!   `min(batch, quinn_udp::BATCH_SIZE)` reusable buffers. With GRO one buffer
//!   may hold several datagrams of `stride` bytes; they are split into
//!   separate [`KernelDatagram`]s (payloads are copied out of the receive
//!   buffer). A buffer holding one datagram is handed out as it is and
//!   replaced from a free list of receive buffers (no copy: on `lo` a
//!   datagram of 32 KiB fills a GSO send, so it usually arrives alone).
//!   Datagrams beyond `max` are kept for the next call.
//! - `send_burst` coalesces runs of datagrams to the same peer with the same
//!   size (the last of a run may be shorter) into one GSO message, and hands
//!   consecutive messages to the kernel in one `sendmmsg` (one system call
//!   per burst where the messages share a segment size; the kernel takes a
//!   datagram no longer than the segment size as it is). Without GSO each
//!   datagram is a message of its own, still one `sendmmsg` per burst.
//! - `quinn-udp` sets `IP_MTU_DISCOVER = IP_PMTUDISC_PROBE` (DF set, never
//!   fragment): `max_payload` must fit the path MTU (MTU - 28), or sends fail
//!   with `EMSGSIZE` and are dropped and counted.
//! - Datagrams larger than `max_payload` that arrive are dropped and counted
//!   in `rx_errors` (they cannot be represented in a `KernelDatagram`).
//! - `IP_RECVERR` is on: an ICMP port unreachable for a datagram we sent
//!   (nobody listens at that address any more: the peer's process is gone)
//!   is read from the socket's error queue and kept for
//!   [`KernelUdp::take_closed_ports`]. A send or receive that the kernel
//!   fails with a pending ICMP error (port or host unreachable, too big) is
//!   retried once the queue is read.

use std::collections::VecDeque;
use std::io::{self, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::Instant;

use quinn_udp::{RecvMeta, UdpSockRef, UdpSocketState, BATCH_SIZE};
use socket2::{Domain, Protocol, Socket, Type};

use super::{Datagram, PacketIo};

/// Largest UDP payload in one IPv4 datagram (65535 - 20 IP - 8 UDP).
pub const MAX_UDP_PAYLOAD_V4: usize = 65_507;
/// Most segments one GSO send may carry (Linux's `UDP_MAX_SEGMENTS`).
const MAX_GSO_RUN: usize = 64;
/// Most messages in one `sendmmsg` (well under the kernel's `UIO_MAXIOV`).
const MAX_MMSG: usize = 64;

/// Size of one receive buffer when GRO is on: holds any aggregate the kernel
/// can hand up for IPv4 (at most 64 KiB of payload).
const GRO_BUF_LEN: usize = 65_535;

/// Most buffers kept on the free list; beyond that sent buffers are freed.
const FREE_LIST_MAX: usize = 4096;
/// Most spare receive buffers kept, per receive buffer in use (each up to
/// 64 KiB with GRO); received datagrams given back beyond that are freed.
const RX_FREE_PER_BUF: usize = 4;

/// IPv4 (20) + UDP (8) header bytes.
const IPV4_UDP_HEADERS: usize = 28;

/// The MTU of the kernel's route to `to` (IP_MTU of a UDP socket connected
/// to it; nothing is sent): 65536 over loopback, the interface's MTU
/// otherwise.
pub fn route_mtu(to: SocketAddrV4) -> io::Result<usize> {
    route_mtu_via(&route_probe()?, to)
}

/// An unbound-port UDP socket for route lookups in the namespace of the
/// thread that creates it.
fn route_probe() -> io::Result<UdpSocket> {
    UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))
}

/// `route_mtu` through `probe`, which a connect re-points at each
/// destination (a UDP connect sends nothing).
fn route_mtu_via(probe: &UdpSocket, to: SocketAddrV4) -> io::Result<usize> {
    probe.connect(to)?;
    let mtu = nix::sys::socket::getsockopt(probe, nix::sys::socket::sockopt::IpMtu)
        .map_err(io::Error::from)?;
    Ok(mtu as usize)
}

/// The usual cap for `route_payload`: per-packet costs (QUIC, syscalls)
/// dominate at 1472 bytes; on loopback, 32 KiB datagrams gave 2-3x the
/// bandwidth of 1472-byte ones and more than 64 KiB ones
/// (scripts/bench-allreduce.sh).
pub const ROUTE_PAYLOAD_CAP: usize = 32 << 10;

/// The largest UDP payload that crosses the route to `to` unfragmented,
/// at most `cap`.
pub fn route_payload(to: SocketAddrV4, cap: usize) -> io::Result<usize> {
    Ok(payload_for_mtu(route_mtu(to)?, cap))
}

/// The UDP payload an IPv4 packet of `mtu` bytes carries, at most `cap`.
fn payload_for_mtu(mtu: usize, cap: usize) -> usize {
    mtu.saturating_sub(IPV4_UDP_HEADERS)
        .min(cap)
        .min(MAX_UDP_PAYLOAD_V4)
}

/// Configuration of a [`KernelUdp`] socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelUdpConfig {
    /// Largest UDP payload sent or received (1472 = 1500-byte MTU - 28).
    pub max_payload: usize,
    /// Receive buffers per `recvmmsg` call (capped at `quinn_udp::BATCH_SIZE`, 32).
    pub batch: usize,
    /// `SO_RCVBUF` in bytes (the kernel doubles it and caps it at `rmem_max`).
    pub recv_buffer: Option<usize>,
    /// `SO_SNDBUF` in bytes (the kernel doubles it and caps it at `wmem_max`;
    /// the effective minimum is 4608).
    pub send_buffer: Option<usize>,
    /// Use UDP GSO on send when the kernel supports it.
    pub gso: bool,
    /// Use UDP GRO on receive when the kernel supports it.
    pub gro: bool,
}

impl Default for KernelUdpConfig {
    fn default() -> Self {
        Self {
            max_payload: 1472,
            batch: 32,
            recv_buffer: None,
            send_buffer: None,
            gso: true,
            gro: true,
        }
    }
}

/// Counters of a [`KernelUdp`] socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelUdpStats {
    /// Datagrams received (after splitting GRO aggregates).
    pub rx_datagrams: u64,
    /// Payload bytes received.
    pub rx_bytes: u64,
    /// `recvmmsg` calls made (including those that found nothing).
    pub rx_calls: u64,
    /// Datagrams handed to the kernel.
    pub tx_datagrams: u64,
    /// Payload bytes handed to the kernel.
    pub tx_bytes: u64,
    /// `sendmmsg` calls that sent at least one message.
    pub tx_calls: u64,
    /// Datagrams dropped on send (send errors other than backpressure, and
    /// wrong source port).
    pub tx_dropped: u64,
    /// Receive errors: failed `recvmmsg` calls, and datagrams dropped because
    /// they were larger than `max_payload` or came from a non-IPv4 peer.
    pub rx_errors: u64,
    /// GSO sends carrying more than one datagram.
    pub gso_batches: u64,
    /// Datagrams dropped because their `local_port` was not this socket's
    /// port (a programming error; also counted in `tx_dropped`).
    pub wrong_source_port: u64,
    /// ICMP port unreachable errors read from the error queue.
    pub port_unreachable: u64,
    /// Other errors read from the error queue (host unreachable, too big).
    pub icmp_other: u64,
    /// Sends the kernel failed for an earlier datagram's ICMP error, and
    /// that went again.
    pub icmp_retries: u64,
}

/// Errors from [`KernelUdp::bind`]; each message names the fix.
#[derive(Debug, thiserror::Error)]
pub enum KernelUdpError {
    #[error("invalid KernelUdpConfig: {0}")]
    Config(String),
    #[error(
        "cannot bind UDP {addr}: address already in use; stop the process holding it \
         (`ss -uanp | grep :{port}`), pick another port, or use port 0 for an ephemeral port",
        port = addr.port()
    )]
    AddrInUse {
        addr: SocketAddrV4,
        #[source]
        source: io::Error,
    },
    #[error(
        "cannot bind UDP {addr}: permission denied; ports below 1024 need root or \
         CAP_NET_BIND_SERVICE, use a port >= 1024 or port 0"
    )]
    PermissionDenied {
        addr: SocketAddrV4,
        #[source]
        source: io::Error,
    },
    #[error(
        "cannot bind UDP {addr}: {ip} is not an address of this host; bind 0.0.0.0 or an \
         address listed by `ip -4 addr`",
        ip = addr.ip()
    )]
    AddrNotAvailable {
        addr: SocketAddrV4,
        #[source]
        source: io::Error,
    },
    #[error("cannot bind UDP {addr}: {source}")]
    Bind {
        addr: SocketAddrV4,
        #[source]
        source: io::Error,
    },
    #[error(
        "cannot set {option} to {bytes} bytes on UDP socket: {source}; \
         choose a smaller size or raise net.core.{sysctl}",
        sysctl = if *option == "SO_RCVBUF" { "rmem_max" } else { "wmem_max" }
    )]
    BufferSize {
        option: &'static str,
        bytes: usize,
        #[source]
        source: io::Error,
    },
    #[error(
        "cannot {what} for UDP socket: {source}; check the process's file descriptor limit \
         (`ulimit -n`) and that IPv4 UDP is available"
    )]
    Socket {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Datagrams of the kernel backend live in heap buffers: `max_payload` long
/// from `alloc`, a receive buffer's length (`max_payload + 1`, or 64 KiB
/// with GRO) when received whole.
pub type KernelDatagram = super::heap::HeapDatagram;

/// [`PacketIo`] over one non-blocking kernel UDP socket.
pub struct KernelUdp {
    socket: UdpSocket,
    state: UdpSocketState,
    local: SocketAddrV4,
    max_payload: usize,
    batch: usize,
    gso: bool,
    gro: bool,
    /// Receive buffers (`batch` of them, each `rx_len` long).
    rx_bufs: Vec<Vec<u8>>,
    rx_len: usize,
    /// Spare receive buffers, to replace one handed out whole.
    rx_free: Vec<Vec<u8>>,
    rx_meta: Vec<RecvMeta>,
    /// Received datagrams beyond the caller's `max`, delivered next call.
    pending: VecDeque<KernelDatagram>,
    /// Buffers (each `max_payload` long) ready for `alloc`.
    free: Vec<Vec<u8>>,
    stats: KernelUdpStats,
    wrong_port_logged: bool,
    /// Destinations reported closed (ICMP port unreachable), not yet taken.
    closed_ports: Vec<SocketAddrV4>,
    /// Control-message space for error-queue reads: the error and the
    /// IP_PKTINFO / TOS / timestamp that quinn-udp asks for on every
    /// message (heap: cmsg headers need alignment).
    errqueue_cmsg: Vec<u8>,
    /// Route lookups for `max_payload_to`, made when the socket was: a
    /// socket lives in the network namespace it was created in, which
    /// need not be the calling thread's.
    route_probe: UdpSocket,
}

/// Most closed ports kept until taken (later ones are dropped).
const CLOSED_PORTS_MAX: usize = 1024;

impl std::fmt::Debug for KernelUdp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelUdp")
            .field("local", &self.local)
            .field("max_payload", &self.max_payload)
            .field("batch", &self.batch)
            .field("gso", &self.gso)
            .field("gro", &self.gro)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// The socket's descriptor, so a driver can sleep in `poll(2)` until
/// datagrams arrive instead of spinning.
impl std::os::fd::AsFd for KernelUdp {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.socket)
    }
}

impl KernelUdp {
    /// Bind a non-blocking UDP socket to `addr` (port 0: an ephemeral port).
    pub fn bind(addr: SocketAddrV4, cfg: KernelUdpConfig) -> Result<Self, KernelUdpError> {
        if cfg.max_payload == 0 || cfg.max_payload > MAX_UDP_PAYLOAD_V4 {
            return Err(KernelUdpError::Config(format!(
                "max_payload {} must be in 1..={MAX_UDP_PAYLOAD_V4} (1472 for a 1500-byte MTU)",
                cfg.max_payload
            )));
        }
        if cfg.batch == 0 {
            return Err(KernelUdpError::Config(
                "batch must be at least 1 (32 is a good default)".into(),
            ));
        }
        let batch = cfg.batch.min(BATCH_SIZE);

        let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).map_err(|e| {
            KernelUdpError::Socket {
                what: "create",
                source: e,
            }
        })?;
        if let Some(bytes) = cfg.recv_buffer {
            sock.set_recv_buffer_size(bytes)
                .map_err(|e| KernelUdpError::BufferSize {
                    option: "SO_RCVBUF",
                    bytes,
                    source: e,
                })?;
        }
        if let Some(bytes) = cfg.send_buffer {
            sock.set_send_buffer_size(bytes)
                .map_err(|e| KernelUdpError::BufferSize {
                    option: "SO_SNDBUF",
                    bytes,
                    source: e,
                })?;
        }
        sock.bind(&SocketAddr::V4(addr).into())
            .map_err(|e| match e.kind() {
                io::ErrorKind::AddrInUse => KernelUdpError::AddrInUse { addr, source: e },
                io::ErrorKind::PermissionDenied => {
                    KernelUdpError::PermissionDenied { addr, source: e }
                }
                io::ErrorKind::AddrNotAvailable => {
                    KernelUdpError::AddrNotAvailable { addr, source: e }
                }
                _ => KernelUdpError::Bind { addr, source: e },
            })?;
        let socket: UdpSocket = sock.into();

        // Sets O_NONBLOCK, IP_PKTINFO, IP_RECVTOS, IP_MTU_DISCOVER=PROBE,
        // UDP_GRO (when supported) and probes UDP_SEGMENT.
        let state =
            UdpSocketState::new(UdpSockRef::from(&socket)).map_err(|e| KernelUdpError::Socket {
                what: "configure (quinn-udp)",
                source: e,
            })?;

        state
            .enable_transport_errors(UdpSockRef::from(&socket))
            .map_err(|e| KernelUdpError::Socket {
                what: "enable IP_RECVERR",
                source: e,
            })?;

        let gso = cfg.gso && state.max_gso_segments() > 1;
        let mut gro = state.gro_segments() > 1;
        if gro && !cfg.gro {
            disable_gro(&socket).map_err(|e| KernelUdpError::Socket {
                what: "turn UDP_GRO off",
                source: e,
            })?;
            gro = false;
        }

        let local = match socket.local_addr() {
            Ok(SocketAddr::V4(a)) => a,
            Ok(SocketAddr::V6(_)) => unreachable!("AF_INET socket has an IPv4 address"),
            Err(e) => {
                return Err(KernelUdpError::Socket {
                    what: "read the bound address",
                    source: e,
                })
            }
        };

        // One spare byte detects datagrams larger than max_payload (the
        // kernel truncates silently and quinn-udp's recvmmsg does not report
        // MSG_TRUNC).
        let rx_len = if gro {
            GRO_BUF_LEN.max(cfg.max_payload + 1)
        } else {
            cfg.max_payload + 1
        };

        tracing::info!(
            local = %local,
            gso,
            gso_supported = state.max_gso_segments() > 1,
            max_gso_segments = state.max_gso_segments(),
            gro,
            gro_supported = state.gro_segments() > 1,
            max_payload = cfg.max_payload,
            batch,
            "kernel UDP socket bound"
        );

        let route_probe = route_probe().map_err(|e| KernelUdpError::Socket {
            what: "create the route-lookup socket",
            source: e,
        })?;
        Ok(Self {
            route_probe,
            socket,
            state,
            local,
            max_payload: cfg.max_payload,
            batch,
            gso,
            gro,
            rx_bufs: (0..batch).map(|_| vec![0; rx_len]).collect(),
            rx_len,
            rx_free: Vec::new(),
            rx_meta: vec![RecvMeta::default(); batch],
            pending: VecDeque::new(),
            free: Vec::new(),
            stats: KernelUdpStats::default(),
            wrong_port_logged: false,
            closed_ports: Vec::new(),
            errqueue_cmsg: vec![0; 256],
        })
    }

    /// Destinations the kernel reported closed since the last call: an
    /// ICMP port unreachable came back for a datagram sent there, so no
    /// socket was bound there then (a peer's process exited or crashed, or
    /// had not bound yet). Found by the last `poll`, send or receive.
    pub fn take_closed_ports(&mut self) -> Vec<SocketAddrV4> {
        std::mem::take(&mut self.closed_ports)
    }

    /// Reads the socket's error queue (non-blocking) and keeps the
    /// destinations of port-unreachable errors (the queue's messages carry
    /// the original datagram's destination as their address). Returns how
    /// many errors it read.
    fn read_error_queue(&mut self) -> usize {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, SockaddrIn};
        use std::os::fd::AsRawFd;
        let fd = self.socket.as_raw_fd();
        let mut read = 0;
        loop {
            let (dest, refused) = {
                let mut payload = [0u8; 1];
                let mut iov = [IoSliceMut::new(&mut payload)];
                let flags = MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT;
                let cmsg = Some(&mut self.errqueue_cmsg[..]);
                let Ok(msg) = recvmsg::<SockaddrIn>(fd, &mut iov, cmsg, flags) else {
                    return read; // EAGAIN: the queue is empty
                };
                let refused = msg.cmsgs().into_iter().flatten().any(|c| {
                    matches!(c, ControlMessageOwned::Ipv4RecvErr(e, _)
                        if e.ee_origin == nix::libc::SO_EE_ORIGIN_ICMP
                            && e.ee_errno == nix::libc::ECONNREFUSED as u32)
                });
                (
                    msg.address.map(|a| SocketAddrV4::new(a.ip(), a.port())),
                    refused,
                )
            };
            read += 1;
            match dest {
                Some(d) if refused => {
                    self.stats.port_unreachable += 1;
                    let room = self.closed_ports.len() < CLOSED_PORTS_MAX;
                    if room && !self.closed_ports.contains(&d) {
                        tracing::debug!(local = %self.local, peer = %d, "ICMP port unreachable");
                        self.closed_ports.push(d);
                    }
                }
                _ => self.stats.icmp_other += 1,
            }
        }
    }

    /// The bound address (with the actual port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }

    /// One `sendmmsg` of `msgs` (consecutive messages from the front of
    /// `bufs`, each `msgs[k]` datagrams to one peer), all with UDP_SEGMENT
    /// `seg` when given. The kernel gathers each message's datagrams itself
    /// (one iovec each), so nothing is copied into one buffer first.
    /// Returns how many messages the kernel took; an error is the first
    /// message's.
    fn send_messages(
        &self,
        bufs: &[KernelDatagram],
        msgs: &[usize],
        seg: Option<u16>,
    ) -> io::Result<usize> {
        use nix::sys::socket::{sendmmsg, ControlMessage, MsgFlags, MultiHeaders, SockaddrIn};
        use std::os::fd::AsRawFd;
        let datagrams: usize = msgs.iter().sum();
        let iov: Vec<io::IoSlice<'_>> = bufs[..datagrams]
            .iter()
            .map(|d| io::IoSlice::new(d.payload()))
            .collect();
        let mut per_msg: Vec<&[io::IoSlice<'_>]> = Vec::with_capacity(msgs.len());
        let mut addrs: Vec<Option<SockaddrIn>> = Vec::with_capacity(msgs.len());
        let mut at = 0;
        for &n in msgs {
            per_msg.push(&iov[at..at + n]);
            addrs.push(Some(SockaddrIn::from(bufs[at].peer)));
            at += n;
        }
        let seg_ref;
        let cmsgs: &[ControlMessage<'_>] = match &seg {
            Some(s) => {
                seg_ref = [ControlMessage::UdpGsoSegments(s)];
                &seg_ref
            }
            None => &[],
        };
        let space = seg.map(|_| nix::cmsg_space!(u16));
        let mut headers = MultiHeaders::<SockaddrIn>::preallocate(msgs.len(), space);
        let sent = sendmmsg(
            self.socket.as_raw_fd(),
            &mut headers,
            &per_msg,
            &addrs,
            cmsgs,
            MsgFlags::empty(),
        )
        .map_err(io::Error::from)?;
        Ok(sent.count())
    }

    /// Counts the datagrams of the messages `sent` (run lengths, from the
    /// start of `bufs`) as sent; returns how many they are.
    fn count_sent(&mut self, bufs: &[KernelDatagram], sent: &[usize]) -> usize {
        let mut at = 0;
        for &n in sent {
            let bytes: usize = bufs[at..at + n].iter().map(|d| d.len).sum();
            self.stats.tx_datagrams += n as u64;
            self.stats.tx_bytes += bytes as u64;
            if n > 1 {
                self.stats.gso_batches += 1;
            }
            at += n;
        }
        at
    }

    /// Counters since bind.
    pub fn stats(&self) -> KernelUdpStats {
        self.stats
    }

    /// Whether sends use UDP GSO (configured and supported; turned off for
    /// good if the kernel or driver rejects a GSO send).
    pub fn gso_enabled(&self) -> bool {
        self.gso && self.state.max_gso_segments() > 1
    }

    /// Whether receives use UDP GRO (configured and supported).
    pub fn gro_enabled(&self) -> bool {
        self.gro
    }

    /// Most datagrams one GSO send carries (1 without GSO).
    pub fn max_gso_segments(&self) -> usize {
        if self.gso {
            self.state.max_gso_segments()
        } else {
            1
        }
    }

    /// Effective `SO_RCVBUF` (what the kernel applied, usually twice what was asked).
    pub fn recv_buffer_size(&self) -> io::Result<usize> {
        self.state.recv_buffer_size(UdpSockRef::from(&self.socket))
    }

    /// Effective `SO_SNDBUF`.
    pub fn send_buffer_size(&self) -> io::Result<usize> {
        self.state.send_buffer_size(UdpSockRef::from(&self.socket))
    }

    /// Give a buffer (e.g. a received datagram the caller is done with) back
    /// to the free list `alloc` draws from.
    pub fn recycle(&mut self, d: KernelDatagram) {
        self.put_free(d.into_vec());
    }

    fn put_free(&mut self, buf: Vec<u8>) {
        if buf.len() == self.max_payload {
            if self.free.len() < FREE_LIST_MAX {
                self.free.push(buf);
            }
        } else if buf.len() == self.rx_len && self.rx_free.len() < RX_FREE_PER_BUF * self.batch {
            self.rx_free.push(buf);
        }
    }

    fn take_buf(&mut self) -> Vec<u8> {
        self.free.pop().unwrap_or_else(|| vec![0; self.max_payload])
    }

    /// Turn one received chunk into a datagram; `None` (counted) if too big.
    /// `whole`: the chunk is all the buffer holds, so the buffer itself is
    /// handed out.
    fn make_rx(
        &mut self,
        chunk_len: usize,
        peer: SocketAddrV4,
        buf_idx: usize,
        off: usize,
        whole: bool,
    ) -> Option<KernelDatagram> {
        if chunk_len > self.max_payload {
            self.stats.rx_errors += 1;
            return None;
        }
        let buf = if whole {
            let spare = self.rx_free.pop().unwrap_or_else(|| vec![0; self.rx_len]);
            std::mem::replace(&mut self.rx_bufs[buf_idx], spare)
        } else {
            let mut buf = self.take_buf();
            buf[..chunk_len].copy_from_slice(&self.rx_bufs[buf_idx][off..off + chunk_len]);
            buf
        };
        self.stats.rx_datagrams += 1;
        self.stats.rx_bytes += chunk_len as u64;
        let mut d = KernelDatagram::from_vec(buf);
        d.set_len(chunk_len);
        d.set_peer(peer);
        d.set_local_port(self.local.port());
        Some(d)
    }

    /// The messages of one `sendmmsg` from `i` on, as run lengths (see
    /// [`Self::run_len`]) in `msgs`, and the UDP_SEGMENT size they share
    /// (`None`: every message is one datagram). A datagram alone may join
    /// GSO runs when it is no longer than their segment size (the kernel
    /// sends it as it is). Stops before a datagram of another source port.
    fn plan_messages(
        &self,
        bufs: &[KernelDatagram],
        i: usize,
        msgs: &mut Vec<usize>,
    ) -> Option<u16> {
        msgs.clear();
        let port = self.local.port();
        let mut seg: Option<usize> = None;
        // Lone datagrams so far: any empty, and the longest.
        let (mut lone_empty, mut lone_max) = (false, 0);
        let mut j = i;
        while j < bufs.len()
            && msgs.len() < MAX_MMSG
            && bufs[j].local_port == port
            && bufs[j].peer.port() != 0
        {
            let n = self.run_len(bufs, j);
            let len = bufs[j].len;
            match (n > 1, seg) {
                (true, None) if !lone_empty && lone_max <= len => seg = Some(len),
                (true, Some(s)) if s == len => {}
                (true, _) => break,
                (false, Some(s)) if len == 0 || len > s => break,
                (false, _) => {
                    lone_empty |= len == 0;
                    lone_max = lone_max.max(len);
                }
            }
            msgs.push(n);
            j += n;
        }
        // run_len makes runs only of segments that fit one datagram.
        seg.map(|s| u16::try_from(s).expect("GSO segment fits a datagram"))
    }

    /// Length of the run of datagrams starting at `i` that one send carries.
    fn run_len(&self, bufs: &[KernelDatagram], i: usize) -> usize {
        let first = &bufs[i];
        let seg = first.len;
        if !self.gso || seg == 0 {
            return 1;
        }
        let max_segs = self
            .state
            .max_gso_segments()
            .min(MAX_UDP_PAYLOAD_V4 / seg)
            .clamp(1, MAX_GSO_RUN);
        let mut j = i + 1;
        while j < bufs.len() && j - i < max_segs {
            let d = &bufs[j];
            if d.peer != first.peer
                || d.local_port != self.local.port()
                || d.len == 0
                || d.len > seg
            {
                break;
            }
            j += 1;
            if d.len < seg {
                break; // a shorter segment ends a GSO batch
            }
        }
        j - i
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn disable_gro(socket: &UdpSocket) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt::UdpGroSegment};
    setsockopt(socket, UdpGroSegment, &false).map_err(io::Error::from)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn disable_gro(_socket: &UdpSocket) -> io::Result<()> {
    Ok(())
}

/// What a GSO send fails with where the device or route cannot segment
/// (quinn-udp turns GSO off on the same two).
fn gso_refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(nix::libc::EIO | nix::libc::EINVAL))
}

/// Errors a send can report for an ICMP error that came in for an earlier
/// datagram (the socket's pending error), perhaps to another peer: the
/// send itself did not fail, and is worth one retry even when the error
/// queue had no room to keep the ICMP error (under receive load).
fn reported_by_icmp(e: &io::Error) -> bool {
    use nix::libc::{ECONNREFUSED, EHOSTUNREACH, EMSGSIZE, ENETUNREACH};
    matches!(
        e.raw_os_error(),
        Some(ECONNREFUSED | EHOSTUNREACH | ENETUNREACH | EMSGSIZE)
    )
}

impl PacketIo for KernelUdp {
    type Buf = KernelDatagram;

    fn recv_burst(&mut self, out: &mut Vec<KernelDatagram>, max: usize) -> usize {
        let mut got = 0;
        while got < max {
            match self.pending.pop_front() {
                Some(d) => {
                    out.push(d);
                    got += 1;
                }
                None => break,
            }
        }
        if got == max {
            return got;
        }
        let nbufs = (max - got).min(self.batch);

        self.stats.rx_calls += 1;
        let res = {
            let mut it = self.rx_bufs[..nbufs].iter_mut();
            let mut slices: [IoSliceMut<'_>; BATCH_SIZE] = std::array::from_fn(|_| {
                IoSliceMut::new(it.next().map_or(&mut [][..], |b| &mut b[..]))
            });
            self.state.recv(
                UdpSockRef::from(&self.socket),
                &mut slices[..nbufs],
                &mut self.rx_meta[..nbufs],
            )
        };
        let msgs = match res {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return got,
            // An ICMP error the kernel reported instead of data: read it
            // and take the data next call.
            Err(_) if self.read_error_queue() > 0 => return got,
            Err(e) => {
                tracing::debug!(local = %self.local, error = %e, "recvmmsg failed");
                self.stats.rx_errors += 1;
                return got;
            }
        };

        for k in 0..msgs {
            let meta = self.rx_meta[k];
            let peer = match meta.addr {
                SocketAddr::V4(a) => a,
                SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
                    Some(ip) => SocketAddrV4::new(ip, a.port()),
                    None => {
                        self.stats.rx_errors += 1;
                        continue;
                    }
                },
            };
            let len = meta.len;
            let stride = if meta.stride == 0 || meta.stride > len {
                len
            } else {
                meta.stride
            };
            let mut off = 0;
            loop {
                let chunk = stride.min(len - off);
                if let Some(d) = self.make_rx(chunk, peer, k, off, chunk == len) {
                    if got < max {
                        out.push(d);
                        got += 1;
                    } else {
                        self.pending.push_back(d);
                    }
                }
                off += chunk;
                if off >= len {
                    break;
                }
            }
        }
        got
    }

    fn alloc(&mut self) -> Option<KernelDatagram> {
        let mut d = KernelDatagram::from_vec(self.take_buf());
        d.local_port = self.local.port();
        Some(d)
    }

    fn send_burst(&mut self, bufs: &mut Vec<KernelDatagram>) -> usize {
        let port = self.local.port();
        let mut i = 0;
        // A send that the kernel failed with an ICMP error pending from an
        // earlier datagram (perhaps to another peer: port or host
        // unreachable, too big) is retried once, after reading it.
        let mut retried_at = None;
        let mut msgs = Vec::with_capacity(MAX_MMSG);
        while i < bufs.len() {
            if bufs[i].local_port != port {
                self.stats.wrong_source_port += 1;
                self.stats.tx_dropped += 1;
                if !self.wrong_port_logged {
                    self.wrong_port_logged = true;
                    tracing::warn!(
                        socket_port = port,
                        datagram_port = bufs[i].local_port,
                        "dropping datagram whose local_port is not this socket's port \
                         (programming error; logged once, counted in wrong_source_port)"
                    );
                }
                i += 1;
                continue;
            }

            if bufs[i].peer.port() == 0 {
                // Nobody listens there, and the kernel's refusal (EINVAL)
                // must not be taken for a GSO refusal: a peer whose
                // datagrams came from port 0 turned GSO off for good.
                self.stats.tx_dropped += 1;
                i += 1;
                continue;
            }
            let seg = self.plan_messages(bufs, i, &mut msgs);
            match self.send_messages(&bufs[i..], &msgs, seg) {
                Ok(sent) if sent > 0 => {
                    self.stats.tx_calls += 1;
                    i += self.count_sent(&bufs[i..], &msgs[..sent]);
                }
                // Nothing taken and no error: the rest waits for the next burst.
                Ok(_) => break,
                // The socket buffer is full: the rest waits. (ENOBUFS is
                // not this: the device dropped the datagram, and since we
                // ask for errors (IP_RECVERR) the kernel says so. A device
                // that always drops it, such as a veth whose far end is
                // too narrow for it, would wedge every datagram behind it
                // if it were retried; it is dropped below, and QUIC
                // recovers the loss.)
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e)
                    if retried_at != Some(i)
                        && (self.read_error_queue() > 0 || reported_by_icmp(&e)) =>
                {
                    retried_at = Some(i);
                    self.stats.icmp_retries += 1;
                }
                Err(e) if seg.is_some() && gso_refused(&e) && msgs[0] == 1 => {
                    // A datagram alone refused in a GSO send: older kernels
                    // check it against the segment size on its own route,
                    // which may be narrower than the run's (fixed in 2024).
                    // It goes without GSO; GSO stays on.
                    let mut resent = self.send_messages(&bufs[i..], &[1], None);
                    if resent.as_ref().is_err_and(reported_by_icmp) {
                        // An earlier datagram's ICMP error, reported here.
                        resent = self.send_messages(&bufs[i..], &[1], None);
                    }
                    match resent {
                        Ok(1) => {
                            self.stats.tx_calls += 1;
                            i += self.count_sent(&bufs[i..], &[1]);
                        }
                        Ok(_) => break,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => {
                            tracing::debug!(local = %self.local, peer = %bufs[i].peer, error = %e, "send failed; dropping");
                            self.stats.tx_dropped += 1;
                            i += 1;
                        }
                    }
                }
                Err(e) if seg.is_some() && gso_refused(&e) => {
                    // The route cannot segment: send one datagram per
                    // message from now on instead of dropping these.
                    tracing::info!(local = %self.local, error = %e, "UDP GSO rejected; sending without GSO from now on");
                    self.gso = false;
                }
                Err(e) => {
                    let n = msgs[0];
                    tracing::debug!(local = %self.local, peer = %bufs[i].peer, datagrams = n, error = %e, "sendmmsg failed; dropping");
                    self.stats.tx_dropped += n as u64;
                    i += n;
                }
            }
        }
        for d in bufs.drain(..i) {
            self.put_free(d.into_vec());
        }
        i
    }

    fn release(&mut self, buf: KernelDatagram) {
        self.recycle(buf);
    }

    /// The kernel runs all timers; reads ICMP errors that no send or
    /// receive has reported yet.
    fn poll(&mut self, _now: Instant) {
        self.read_error_queue();
    }

    /// The bound IP. A socket bound to 0.0.0.0 returns 0.0.0.0: the kernel
    /// picks the source address per destination by routing.
    fn local_ip(&self) -> Ipv4Addr {
        *self.local.ip()
    }

    fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// At most `max_payload`, and no more than the kernel's route to
    /// `peer` carries unfragmented (sends are DF: a bigger one would fail
    /// with `EMSGSIZE`, every time it was retransmitted).
    fn max_payload_to(&self, peer: SocketAddrV4) -> usize {
        match route_mtu_via(&self.route_probe, peer) {
            Ok(mtu) => payload_for_mtu(mtu, self.max_payload),
            Err(_) => self.max_payload,
        }
    }
}

impl super::CountedIo for KernelUdp {
    fn counters(&self) -> crate::counters::Counters {
        let s = self.stats();
        let mut c = crate::counters::Counters {
            rx_packets: s.rx_datagrams,
            rx_bytes: s.rx_bytes,
            rx_bursts: s.rx_calls,
            tx_packets: s.tx_datagrams,
            tx_bytes: s.tx_bytes,
            tx_bursts: s.tx_calls,
            udp_in: s.rx_datagrams,
            udp_out: s.tx_datagrams,
            ..Default::default()
        };
        c.drops[crate::counters::DropReason::SendError as usize] = s.tx_dropped;
        c.drops[crate::counters::DropReason::Malformed as usize] = s.rx_errors;
        c
    }
}
