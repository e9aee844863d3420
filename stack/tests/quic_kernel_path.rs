//! QUIC over kernel UDP on real links whose size the endpoints do not
//! know in advance. Kernel UDP sends are DF, so a datagram bigger than
//! the path is lost every time it is retransmitted and the transfer
//! crawls or hangs:
//! - a client that offers far bigger datagrams than its link carries (as
//!   aioquic does: 65527 bytes; here our own endpoint configured for
//!   32 KiB): the server must send what its route carries;
//! - a link in the middle of the path narrower than both ends' own (a
//!   tunnel, PPPoE), with ICMP filtered: the route says nothing, so each
//!   connection must find the path's size by probing (PMTUD);
//! - a client behind a NAT that rebinds it to a new outside port: the
//!   server must follow it there.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use stack::io::kernel::{KernelDatagram, KernelUdp, KernelUdpConfig};
use stack::io::PacketIo;
use stack::quic::perf::{ClientStream, PerfServer, MODE_DISCARD, MODE_ECHO, MODE_SOURCE};
use stack::quic::{CloseReason, ConnHandle, ConnStats, Endpoint, Event, QuicConfig};

/// Both ends allow 32 KiB datagrams, as ainftp-perf's server does when it
/// binds before any peer is known (loopback carries them), and say so in
/// their transport parameters.
const BIG: usize = 32 << 10;

/// What a 1280-byte link carries in one UDP datagram.
const NARROW_PAYLOAD: usize = 1280 - 28;

fn big_socket() -> KernelUdpConfig {
    KernelUdpConfig {
        max_payload: BIG,
        ..KernelUdpConfig::default()
    }
}

/// A kernel UDP socket bound inside network namespace `ns` (it stays
/// there).
fn bind_in(ns: &str, at: SocketAddrV4, cfg: KernelUdpConfig) -> KernelUdp {
    common::in_netns(ns, || KernelUdp::bind(at, cfg).unwrap())
}

/// veth `ainfpm0` here (10.77.0.1, MTU 1500) to `ainfpm1` in namespace
/// `ainfpmns` (10.77.0.2); removed on drop.
struct Link;

impl Link {
    fn up() -> Link {
        common::sh(
            "ip link del ainfpm0 2>/dev/null; ip netns del ainfpmns 2>/dev/null; \
             ip netns add ainfpmns && ip link add ainfpm0 type veth peer name ainfpm1 && \
             ip link set ainfpm1 netns ainfpmns && ip link set ainfpm0 mtu 1500 up && \
             ip addr add 10.77.0.1/24 dev ainfpm0 && \
             ip -n ainfpmns addr add 10.77.0.2/24 dev ainfpm1 && ip -n ainfpmns link set ainfpm1 up",
        );
        Link
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        common::sh("ip link del ainfpm0 2>/dev/null; ip netns del ainfpmns 2>/dev/null; true");
    }
}

/// Client namespace `{name}a` (10.{net}.1.2) - router `{name}r` - server
/// namespace `{name}b` (10.{net}.2.2), each end on its own 1500-byte veth;
/// the router's two interfaces have `router_mtu`. All in namespaces;
/// removed on drop.
struct RoutedPath {
    name: &'static str,
    net: u8,
}

impl RoutedPath {
    fn up(name: &'static str, net: u8, router_mtu: u16) -> RoutedPath {
        let path = RoutedPath { name, net };
        path.down();
        common::sh(&format!(
            "set -e
             for n in {name}a {name}r {name}b; do ip netns add $n; ip -n $n link set lo up; done
             ip link add {name}a0 netns {name}a type veth peer name {name}r0 netns {name}r
             ip link add {name}b0 netns {name}b type veth peer name {name}r1 netns {name}r
             ip -n {name}a addr add 10.{net}.1.2/24 dev {name}a0
             ip -n {name}a link set {name}a0 mtu 1500 up
             ip -n {name}a route add default via 10.{net}.1.1
             ip -n {name}b addr add 10.{net}.2.2/24 dev {name}b0
             ip -n {name}b link set {name}b0 mtu 1500 up
             ip -n {name}b route add default via 10.{net}.2.1
             ip -n {name}r addr add 10.{net}.1.1/24 dev {name}r0
             ip -n {name}r addr add 10.{net}.2.1/24 dev {name}r1
             ip -n {name}r link set {name}r0 mtu {router_mtu} up
             ip -n {name}r link set {name}r1 mtu {router_mtu} up
             ip netns exec {name}r sysctl -qw net.ipv4.ip_forward=1"
        ));
        path
    }

    fn client_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 1, 2)
    }

    fn server_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 2, 2)
    }

    /// Kernel UDP sockets at each end (client, server).
    fn sockets(&self) -> (KernelUdp, KernelUdp) {
        self.sockets_with(big_socket())
    }

    /// The same without GSO, for tests that need each datagram to meet the
    /// router on its own: a GSO batch crosses the veth whole, and a router
    /// too narrow for its segments drops all of them, the small last one
    /// too (a NIC would have cut the batch up before the wire).
    fn unbatched_sockets(&self) -> (KernelUdp, KernelUdp) {
        self.sockets_with(KernelUdpConfig {
            gso: false,
            ..big_socket()
        })
    }

    fn sockets_with(&self, cfg: KernelUdpConfig) -> (KernelUdp, KernelUdp) {
        let n = self.name;
        (
            bind_in(
                &format!("{n}a"),
                SocketAddrV4::new(self.client_ip(), 0),
                cfg.clone(),
            ),
            bind_in(
                &format!("{n}b"),
                SocketAddrV4::new(self.server_ip(), 0),
                cfg,
            ),
        )
    }

    /// The router drops (and counts) the ICMP "fragmentation needed" it
    /// would send for packets too big for its links, as many networks do:
    /// nothing then tells the ends.
    fn filter_icmp(&self) {
        self.router_nft(
            "table ip blackhole {
                 chain out {
                     type filter hook output priority 0;
                     icmp type destination-unreachable counter drop
                 }
             }",
        );
    }

    /// Packets the router dropped for being too big (see `filter_icmp`).
    fn too_big_drops(&self) -> u64 {
        let out = common::sh_out(&format!(
            "ip netns exec {}r nft list table ip blackhole",
            self.name
        ));
        out.split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Change the MTU of the router's two interfaces.
    fn set_router_mtu(&self, mtu: u16) {
        let n = self.name;
        common::sh(&format!(
            "ip -n {n}r link set {n}r0 mtu {mtu} && ip -n {n}r link set {n}r1 mtu {mtu}"
        ));
    }

    /// Load an nftables ruleset into the router.
    fn router_nft(&self, rules: &str) {
        common::sh(&format!(
            "ip netns exec {}r nft -f - <<'EOF'\n{rules}\nEOF",
            self.name
        ));
    }

    /// The router as the client's NAT: it maps the client's port `real`
    /// to `outside` (stateless, both ways), replacing any earlier mapping,
    /// as a NAT does when an idle mapping expires or it restarts.
    fn map_client_port(&self, real: u16, outside: u16) {
        let c = self.client_ip();
        self.nat_rules(&format!(
            "ip saddr {c} udp sport {real} counter udp sport set {outside} notrack
             ip daddr {c} udp dport {outside} counter udp dport set {real} notrack"
        ));
    }

    /// The router as a NAT that restarts: everything from and to the
    /// client is dropped until the next `map_client_port`.
    fn drop_client_traffic(&self) {
        let c = self.client_ip();
        self.nat_rules(&format!("ip saddr {c} drop\n ip daddr {c} drop"));
    }

    /// Replaces the router's NAT rules (run before its routing).
    fn nat_rules(&self, rules: &str) {
        self.router_nft(&format!(
            "table ip nat
             delete table ip nat
             table ip nat {{
                 chain pre {{
                     type filter hook prerouting priority -300;
                     {rules}
                 }}
             }}"
        ));
    }

    fn down(&self) {
        let n = self.name;
        common::sh(&format!(
            "for x in {n}a {n}r {n}b; do ip netns del $x 2>/dev/null; done; true"
        ));
    }
}

impl Drop for RoutedPath {
    fn drop(&mut self) {
        self.down();
    }
}

/// Our client and server endpoints, each on its kernel UDP socket, and
/// the perf protocol's server side.
struct Ends {
    client: Endpoint<KernelDatagram>,
    client_io: KernelUdp,
    server: Endpoint<KernelDatagram>,
    server_io: KernelUdp,
    perf: PerfServer,
    /// Datagrams a socket could not take yet (backpressure), kept for the
    /// next round as the endpoints' other callers do.
    client_tx: Vec<KernelDatagram>,
    server_tx: Vec<KernelDatagram>,
}

impl Ends {
    /// Both endpoints allow `BIG` datagrams and take the rest of their
    /// configuration from `config`, on certificates from `cluster`.
    fn new(
        (client_io, server_io): (KernelUdp, KernelUdp),
        cluster: &str,
        config: impl Fn(QuicConfig) -> QuicConfig,
    ) -> Ends {
        let dir = common::cluster(cluster);
        let node = |name| {
            config(QuicConfig {
                max_udp_payload: BIG,
                ..common::perf_node_config(&dir, name)
            })
        };
        Ends {
            client: Endpoint::client(node("client"), 0, BIG).unwrap(),
            client_io,
            server: Endpoint::server(node("server"), 0, BIG).unwrap(),
            server_io,
            perf: PerfServer::new(),
            client_tx: Vec::new(),
            server_tx: Vec::new(),
        }
    }

    /// The client's connection to the server, once established.
    fn connect(&mut self) -> ConnHandle {
        // Sized by the client's route, as the server sizes what it accepts.
        let conn = self
            .client
            .connect_via(
                &self.client_io,
                self.client_io.local_addr(),
                self.server_io.local_addr(),
                Some("server"),
            )
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.client.is_established(conn) {
            assert!(Instant::now() < deadline, "no handshake in 10 s");
            self.drive();
        }
        conn
    }

    /// One round of both endpoints and the perf server; whether anything
    /// moved.
    fn drive(&mut self) -> bool {
        let moved = self.drive_endpoints();
        self.perf.poll(&mut self.server);
        while let Some(e) = self.client.poll_event() {
            if let Event::Closed { reason, .. } = e {
                panic!("closed: {reason}");
            }
        }
        if moved == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
        moved > 0
    }

    /// One round of both endpoints alone; how many datagrams moved.
    fn drive_endpoints(&mut self) -> usize {
        self.server.drive(&mut self.server_io, &mut self.server_tx)
            + self.client.drive(&mut self.client_io, &mut self.client_tx)
    }

    /// Both ends run for `d` (acknowledgements settle).
    fn settle(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.drive();
        }
    }

    /// For `d`, the server sends the client a DATAGRAM frame every 5 ms.
    /// Returns how many arrived, stopping at the first if `first`.
    fn server_datagrams(&mut self, conn: ConnHandle, d: Duration, first: bool) -> usize {
        let served = self.perf.connections()[0];
        let until = Instant::now() + d;
        let mut next = Instant::now();
        let mut got = 0;
        let mut buf = [0u8; 64];
        while Instant::now() < until && !(first && got > 0) {
            if Instant::now() >= next {
                self.server.dgram_send(served, b"tick").unwrap();
                next += Duration::from_millis(5);
            }
            self.drive();
            while self.client.dgram_recv(conn, &mut buf).unwrap().is_some() {
                got += 1;
            }
        }
        got
    }

    /// The client downloads `bytes` of the perf pattern from the server
    /// on a new stream of `conn` within `limit`.
    fn download(&mut self, conn: ConnHandle, bytes: u64, limit: Duration) {
        self.exchange_with(conn, MODE_SOURCE, bytes, limit, |_| {});
    }

    /// `bytes` on a perf stream of `mode` (the server sends them, takes
    /// them, or sends them back), calling `meanwhile` with the bytes moved
    /// so far between steps.
    fn exchange_with(
        &mut self,
        conn: ConnHandle,
        mode: u8,
        bytes: u64,
        limit: Duration,
        mut meanwhile: impl FnMut(u64),
    ) {
        let id = self.client.open_bidi(conn).unwrap();
        let mut stream = ClientStream::new(id, mode, bytes);
        let mut scratch = vec![0u8; 64 << 10];
        let deadline = Instant::now() + limit;
        while !stream.is_done() {
            meanwhile(stream.bytes());
            assert!(
                Instant::now() < deadline,
                "{bytes} bytes not moved in {limit:?}: {} of them; server socket {:?}",
                stream.bytes(),
                self.server_io.stats()
            );
            self.drive();
            stream.poll(&mut self.client, conn, &mut scratch);
        }
        assert!(stream.is_correct(), "{bytes} bytes of the pattern");
    }

    /// The server's statistics of the connection it served first.
    fn served(&mut self) -> ConnStats {
        let h = self.perf.connections()[0];
        self.server.conn_stats(h).unwrap()
    }
}

/// `io` sent full-size datagrams and none too big for its 1500-byte path.
fn assert_sent_what_the_path_carries(io: &KernelUdp) {
    let sent = io.stats();
    assert_eq!(
        sent.tx_dropped, 0,
        "no datagram too big for the path: {sent:?}"
    );
    assert!(
        sent.tx_bytes / sent.tx_datagrams > 1000,
        "full-size packets, not 1200-byte ones: {sent:?}"
    );
}

#[test]
fn each_end_sends_what_the_path_carries_not_what_the_peer_offers() {
    let _link = Link::up();
    let server_io = KernelUdp::bind(
        SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 1), 0),
        big_socket(),
    )
    .unwrap();
    let client_io = bind_in(
        "ainfpmns",
        SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 2), 0),
        big_socket(),
    );
    assert_eq!(server_io.max_payload(), BIG);
    assert_eq!(
        server_io.max_payload_to(client_io.local_addr()),
        1472,
        "the route to the client is the 1500-byte veth"
    );
    // No probing: what is checked here is the size the server starts from.
    let mut ends = Ends::new((client_io, server_io), "pathmtu", |c| QuicConfig {
        discover_pmtu: false,
        ..c
    });
    let conn = ends.connect();
    ends.download(conn, 4 << 20, Duration::from_secs(20));
    assert_sent_what_the_path_carries(&ends.server_io);
    // The client's endpoint is made for 32 KiB datagrams too; it connected
    // through its backend (`Endpoint::connect_via`), which sizes the
    // connection by the route to the server.
    ends.exchange_with(conn, MODE_DISCARD, 4 << 20, Duration::from_secs(20), |_| {});
    assert_sent_what_the_path_carries(&ends.client_io);
}

#[test]
fn connections_find_a_path_narrower_than_both_ends_links() {
    // A 1280-byte router between two 1500-byte links, which says nothing.
    let path = RoutedPath::up("ainfnp", 60, 1280);
    path.filter_icmp();
    let (client_io, server_io) = path.sockets();
    // Each end's own link says 1500: the route lookups cannot see the
    // narrow middle.
    assert_eq!(client_io.max_payload_to(server_io.local_addr()), 1472);
    assert_eq!(server_io.max_payload_to(client_io.local_addr()), 1472);
    let mut ends = Ends::new((client_io, server_io), "narrowpath", |c| c);
    assert!(
        QuicConfig::default().discover_pmtu,
        "PMTUD is on by default"
    );
    let conn = ends.connect();
    ends.download(conn, 32 << 20, Duration::from_secs(20));
    assert!(
        path.too_big_drops() > 0,
        "probes above the path's size were dropped in the middle"
    );
    // The server, which sent the data, settled on the path's size: its
    // search (RFC 8899's binary search from 1472 down to QUIC's 1200-byte
    // floor) ends only when a size is acknowledged and one byte more is
    // not; while it searches, this reads the size being probed.
    let size = ends.served().max_datagram;
    assert_eq!(
        size, NARROW_PAYLOAD,
        "the server sends {size}-byte datagrams over a {NARROW_PAYLOAD}-byte path"
    );
}

/// A client behind the router as its NAT, connected from outside port
/// 40001: the path, both ends, the client's real port and the connection.
fn connected_behind_nat(
    name: &'static str,
    net: u8,
    tag: &str,
    config: impl Fn(QuicConfig) -> QuicConfig,
) -> (RoutedPath, Ends, u16, ConnHandle) {
    let path = RoutedPath::up(name, net, 1500);
    let (client_io, server_io) = path.sockets();
    let real = client_io.local_addr().port();
    path.map_client_port(real, 40_001);
    let mut ends = Ends::new((client_io, server_io), tag, config);
    let conn = ends.connect();
    (path, ends, real, conn)
}

impl Ends {
    /// The server sends to the client at its outside port `port`.
    fn assert_client_at(&self, path: &RoutedPath, port: u16, what: &str) {
        let served = self.perf.connections()[0];
        let at = SocketAddrV4::new(path.client_ip(), port);
        assert_eq!(self.server.peer(served), Some(at), "{what}");
    }
}

#[test]
fn a_server_follows_its_client_through_a_nat_rebinding() {
    // The router is the client's NAT: it maps the client's port to an
    // outside one (stateless, both ways), and later rebinds the client to
    // another, as a NAT does when an idle mapping expires or it restarts.
    // The client does not know; only the server sees it move.
    let (path, mut ends, real, conn) = connected_behind_nat("ainfnr", 61, "rebinding", |c| c);
    ends.download(conn, 4 << 20, Duration::from_secs(20));
    ends.assert_client_at(&path, 40_001, "first");
    // The connection goes quiet (the trainer computes), and the NAT's
    // mapping is replaced meanwhile.
    ends.settle(Duration::from_millis(100));
    path.map_client_port(real, 40_002);
    ends.download(conn, 4 << 20, Duration::from_secs(20));
    ends.assert_client_at(&path, 40_002, "moved to the client's new outside address");
    // And again, twice as often as the path table has room: released
    // quiche 0.30 kept every path it had used, and with a full table the
    // server dropped everything from the next address (our patch evicts
    // the path left longest ago, third_party/quiche/PATCHES.md).
    let rebindings = 2 * stack::quic::config::PATHS_PER_CONNECTION as u16;
    for outside in 40_003..=40_001 + rebindings {
        ends.settle(Duration::from_millis(100));
        path.map_client_port(real, outside);
        ends.download(conn, 1 << 20, Duration::from_secs(20));
        ends.assert_client_at(&path, outside, "rebound again");
    }
}

/// The NAT moves the client while the server is sending: every packet
/// in flight to the old port is lost, and nothing will ever acknowledge
/// them. The server must send their data again on the new path, promptly,
/// not a packet or two per probe timeout (quiche issue 2452).
#[test]
fn a_transfer_goes_on_when_the_nat_rebinds_its_client_in_mid_transfer() {
    transfers_go_on_through_rebindings("ainfnm", 63, "cubic");
}

/// The same with quiche's other congestion code, behind "bbr2".
#[test]
fn a_transfer_goes_on_when_the_nat_rebinds_its_client_in_mid_transfer_under_bbr2() {
    transfers_go_on_through_rebindings("ainfnb", 65, "bbr2");
}

fn transfers_go_on_through_rebindings(name: &'static str, net: u8, congestion_control: &str) {
    let (path, mut ends, real, conn) =
        connected_behind_nat(name, net, "midrebind", |c| QuicConfig {
            congestion_control: congestion_control.to_owned(),
            ..c
        });
    // Each exchange must finish in 10 s; released quiche 0.30 did not
    // finish the first in 20.
    for (k, outside) in (40_002..40_006).enumerate() {
        let mut moved = false;
        ends.exchange_with(
            conn,
            MODE_ECHO,
            16 << 20,
            Duration::from_secs(10),
            |bytes| {
                if bytes >= 4 << 20 && !moved {
                    path.map_client_port(real, outside);
                    moved = true;
                }
            },
        );
        ends.assert_client_at(&path, outside, &format!("rebinding {k}"));
    }
}

/// A client that only receives (here DATAGRAM frames) has nothing of its
/// own in flight, so once the server's packets stop reaching it, it sends
/// nothing. When its NAT restarts (drops everything, then maps it to a new
/// port), the server keeps sending to the old port and cannot learn where
/// the client went; the client's keepalive PING (`QuicConfig::keepalive`,
/// 1 s) tells it.
#[test]
fn a_client_that_only_receives_is_found_again_after_its_nat_restarts() {
    // Path MTU discovery off: its probes would be the client's own
    // packets in flight, and their retransmission would reveal it.
    let (path, mut ends, real, conn) =
        connected_behind_nat("ainfnk", 64, "keepalive", |c| QuicConfig {
            discover_pmtu: false,
            ..c
        });
    // A download first: the perf server lists a connection once it has
    // served a stream on it.
    ends.download(conn, 1 << 20, Duration::from_secs(20));
    assert!(
        ends.server_datagrams(conn, Duration::from_millis(200), false) > 0,
        "datagrams reach the client"
    );
    // Quiet, so that the server acknowledges all the client sent (quiche
    // makes every 24th acknowledgement ack-eliciting).
    ends.settle(Duration::from_millis(100));
    let keepalives = ends.client.stats().keepalives;
    path.drop_client_traffic();
    ends.server_datagrams(conn, Duration::from_millis(500), false);
    path.map_client_port(real, 40_002);
    let back = Instant::now();
    let after = ends.server_datagrams(conn, Duration::from_secs(10), true);
    assert!(
        after > 0,
        "no datagram reached the client in 10 s after its NAT came back"
    );
    ends.assert_client_at(&path, 40_002, "after the NAT restart");
    assert!(
        ends.client.stats().keepalives > keepalives,
        "the client said where it is with a keepalive"
    );
    eprintln!(
        "datagrams again {:?} after the NAT came back",
        back.elapsed()
    );
}

#[test]
fn a_connection_checks_its_path_size_again_when_the_path_narrows() {
    let path = RoutedPath::up("ainfns", 62, 1500);
    path.filter_icmp();
    let mut ends = Ends::new(path.sockets(), "pathnarrows", |c| c);
    let conn = ends.connect();
    ends.download(conn, 4 << 20, Duration::from_secs(20));
    assert_eq!(ends.served().max_datagram, 1472, "found at first");
    // The route moves onto a narrower link while the connection is quiet:
    // every packet of the size it found is now lost, and nothing says so.
    ends.settle(Duration::from_millis(100));
    path.set_router_mtu(1280);
    ends.download(conn, 4 << 20, Duration::from_secs(20));
    assert!(path.too_big_drops() > 0, "full-size packets were dropped");
    assert!(
        ends.server.stats().pmtu_rechecks >= 1,
        "the server's stall was taken for a narrower path: {:?}",
        ends.server.stats()
    );
    let size = ends.served().max_datagram;
    assert_eq!(size, NARROW_PAYLOAD, "found again: {size}");
}

/// A 4 MiB download started through a 1280-byte router that filters its
/// ICMP, by ends with PMTUD off, the given idle timeout, and sockets
/// without GSO: every data packet the server sends at its 1472 bytes is
/// lost, and the small packets of either end arrive. Returns the path
/// (removed on drop), the ends, the connection and the download's stream.
fn download_through_a_narrow_router(
    name: &'static str,
    net: u8,
    cluster: &str,
    idle_timeout: Duration,
) -> (RoutedPath, Ends, ConnHandle, ClientStream) {
    let path = RoutedPath::up(name, net, 1280);
    path.filter_icmp();
    let mut ends = Ends::new(path.unbatched_sockets(), cluster, |c| QuicConfig {
        discover_pmtu: false,
        idle_timeout,
        ..c
    });
    let conn = ends.connect();
    let id = ends.client.open_bidi(conn).unwrap();
    let stream = ClientStream::new(id, MODE_SOURCE, 4 << 20);
    (path, ends, conn, stream)
}

/// Without path MTU discovery nothing can shrink a connection's packets
/// to what the path carries. A 1280-byte router that drops bigger packets
/// without a word loses every one the server sends at its 1472 bytes,
/// while the client's small acknowledgements and keepalives get through,
/// so the peer is heard from and the idle timer never runs out. The
/// server must end the connection as stalled after its idle timeout, not
/// retransmit forever.
#[test]
fn a_connection_whose_packets_never_arrive_ends_as_stalled_though_its_peer_is_heard() {
    let idle = Duration::from_secs(3);
    let (_path, mut ends, conn, mut stream) =
        download_through_a_narrow_router("ainfst", 63, "stalled", idle);
    let mut scratch = vec![0u8; 64 << 10];
    let started = Instant::now();
    let (mut server_end, mut client_end) = (None, None);
    while server_end.is_none() || client_end.is_none() {
        assert!(
            started.elapsed() < idle * 4,
            "no end after {:?}: server {server_end:?}, client {client_end:?}, server {:?}",
            started.elapsed(),
            ends.server.stats()
        );
        let moved = ends.drive_endpoints();
        ends.perf.poll(&mut ends.server);
        if client_end.is_none() {
            stream.poll(&mut ends.client, conn, &mut scratch);
        }
        if let Some(Event::Closed { reason, .. }) = ends.perf.closed.pop() {
            server_end = Some((reason, started.elapsed()));
        }
        while let Some(e) = ends.client.poll_event() {
            if let Event::Closed { reason, .. } = e {
                client_end = Some((reason, started.elapsed()));
            }
        }
        if moved == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    assert!(stream.bytes() < 4 << 20, "the download cannot finish");
    let (reason, after) = server_end.unwrap();
    assert!(
        matches!(reason, CloseReason::Stalled { .. }),
        "the server's end: {reason}"
    );
    assert!(
        after >= idle && after < idle * 3,
        "ended {after:?} into the download, with an idle timeout of {idle:?}"
    );
    let (client_reason, client_after) = client_end.unwrap();
    eprintln!("server: {reason} ({after:?}); client: {client_reason} ({client_after:?})");
    assert!(
        matches!(client_reason, CloseReason::Peer { app: false, .. }),
        "the client heard the server's close: {client_reason}"
    );
}

/// quiche limited every packet by the congestion window, the one carrying
/// CONNECTION_CLOSE too. A connection whose window is full of packets the
/// path lost (here: too big for it, PMTUD off) then sent its close only
/// with its next probe timeout, seconds away once they back off, and an
/// application that dropped the connection before that left its peer to
/// time out (third_party/quiche/PATCHES.md). The server closes after six
/// probe timeouts; the client must hear it at once.
#[test]
fn a_connection_with_a_full_congestion_window_sends_its_close_at_once() {
    let (_path, mut ends, conn, mut stream) =
        download_through_a_narrow_router("ainfcc", 64, "closefull", Duration::from_secs(30));
    let mut scratch = vec![0u8; 64 << 10];
    let started = Instant::now();
    // The server's probe timeouts so far (none before it has the connection).
    let probe_timeouts = |ends: &mut Ends| {
        let Some(&served) = ends.perf.connections().first() else {
            return 0;
        };
        let q = ends.server.connection_mut(served).unwrap();
        q.path_stats().find(|p| p.active).unwrap().total_pto_count
    };
    let mut closed_at = None;
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no close in 20 s: closed {:?} ago; server {:?}; client {:?}",
            closed_at.map(|t: Instant| t.elapsed()),
            ends.server.stats(),
            ends.client.stats()
        );
        let moved = ends.drive_endpoints();
        ends.perf.poll(&mut ends.server);
        stream.poll(&mut ends.client, conn, &mut scratch);
        if closed_at.is_none() && probe_timeouts(&mut ends) >= 6 {
            let served = ends.perf.connections()[0];
            ends.server.close(served, 7, b"done here").unwrap();
            closed_at = Some(Instant::now());
        }
        if let Some(Event::Closed { reason, .. }) = ends.client.poll_event() {
            let after = closed_at.map(|t| t.elapsed());
            eprintln!("client: {reason}, {after:?} after the server closed");
            assert_eq!(
                reason,
                CloseReason::Peer {
                    app: true,
                    code: 7,
                    reason: b"done here".to_vec()
                }
            );
            let after = after.expect("closed after the server's close");
            assert!(after < Duration::from_millis(300), "heard {after:?} after");
            break;
        }
        if moved == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    assert!(stream.bytes() < 4 << 20, "the download could not finish");
}
