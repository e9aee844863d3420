//! QUIC over kernel UDP on real links whose size the endpoints do not
//! know in advance. Kernel UDP sends are DF, so a datagram bigger than
//! the path is lost every time it is retransmitted and the transfer
//! crawls or hangs:
//! - a client that offers far bigger datagrams than its link carries (as
//!   aioquic does: 65527 bytes; here our own endpoint configured for
//!   32 KiB): the server must send what its route carries;
//! - a link in the middle of the path narrower than both ends' own (a
//!   tunnel, PPPoE), with ICMP filtered: the route says nothing, so each
//!   connection must find the path's size by probing (PMTUD).

mod common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use stack::io::kernel::{KernelDatagram, KernelUdp, KernelUdpConfig};
use stack::io::PacketIo;
use stack::quic::perf::{ClientStream, PerfServer, MODE_SOURCE};
use stack::quic::{ConnHandle, Endpoint, Event, QuicConfig};

/// Both ends allow 32 KiB datagrams, as ainftp-perf's server does when it
/// binds before any peer is known (loopback carries them), and say so in
/// their transport parameters.
const BIG: usize = 32 << 10;

fn big_socket() -> KernelUdpConfig {
    KernelUdpConfig {
        max_payload: BIG,
        ..KernelUdpConfig::default()
    }
}

/// A kernel UDP socket bound inside network namespace `ns` (it stays
/// there).
fn bind_in(ns: &str, at: SocketAddrV4, cfg: KernelUdpConfig) -> KernelUdp {
    std::thread::scope(|s| {
        s.spawn(|| {
            let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            KernelUdp::bind(at, cfg).unwrap()
        })
        .join()
        .unwrap()
    })
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

/// Client namespace `ainfnpa` (10.60.1.2) - router `ainfnpr` - server
/// namespace `ainfnpb` (10.60.2.2). Both ends' links have a 1500-byte MTU;
/// the router's own two interfaces have 1280, so the path carries UDP
/// payloads of at most 1252 bytes each way, and the router drops ICMP
/// "fragmentation needed" (as many networks do): nothing tells the ends.
/// All in namespaces; removed on drop.
struct NarrowPath;

const NARROW_PAYLOAD: usize = 1280 - 28;

impl NarrowPath {
    fn up() -> NarrowPath {
        NarrowPath::down();
        common::sh(
            "set -e
             for n in ainfnpa ainfnpr ainfnpb; do ip netns add $n; ip -n $n link set lo up; done
             ip link add ainfnpa0 netns ainfnpa type veth peer name ainfnpr0 netns ainfnpr
             ip link add ainfnpb0 netns ainfnpb type veth peer name ainfnpr1 netns ainfnpr
             ip -n ainfnpa addr add 10.60.1.2/24 dev ainfnpa0
             ip -n ainfnpa link set ainfnpa0 mtu 1500 up
             ip -n ainfnpa route add default via 10.60.1.1
             ip -n ainfnpb addr add 10.60.2.2/24 dev ainfnpb0
             ip -n ainfnpb link set ainfnpb0 mtu 1500 up
             ip -n ainfnpb route add default via 10.60.2.1
             ip -n ainfnpr addr add 10.60.1.1/24 dev ainfnpr0
             ip -n ainfnpr addr add 10.60.2.1/24 dev ainfnpr1
             ip -n ainfnpr link set ainfnpr0 mtu 1280 up
             ip -n ainfnpr link set ainfnpr1 mtu 1280 up
             ip netns exec ainfnpr sysctl -qw net.ipv4.ip_forward=1
             ip netns exec ainfnpr nft -f - <<'EOF'
             table ip blackhole {
                 chain out {
                     type filter hook output priority 0;
                     icmp type destination-unreachable counter drop
                 }
             }
EOF",
        );
        NarrowPath
    }

    fn down() {
        common::sh("for n in ainfnpa ainfnpr ainfnpb; do ip netns del $n 2>/dev/null; done; true");
    }

    /// Datagrams the router dropped for being too big: the "fragmentation
    /// needed" messages it would have sent back, counted as it drops them.
    fn too_big_drops() -> u64 {
        let out = common::sh_out("ip netns exec ainfnpr nft list table ip blackhole");
        out.split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for NarrowPath {
    fn drop(&mut self) {
        NarrowPath::down();
    }
}

/// The client downloads `bytes` of the perf pattern from the server
/// within `limit`; returns the client's connection.
fn download(
    client: &mut Endpoint<KernelDatagram>,
    client_io: &mut KernelUdp,
    server: &mut Endpoint<KernelDatagram>,
    server_io: &mut KernelUdp,
    perf: &mut PerfServer,
    bytes: u64,
    limit: Duration,
) -> ConnHandle {
    let conn = client
        .connect(
            client_io.local_addr(),
            server_io.local_addr(),
            Some("server"),
        )
        .unwrap();
    let (mut stx, mut ctx) = (Vec::new(), Vec::new());
    let mut scratch = vec![0u8; 64 << 10];
    let mut download: Option<ClientStream> = None;
    let deadline = Instant::now() + limit;
    while !download.as_ref().is_some_and(ClientStream::is_done) {
        assert!(
            Instant::now() < deadline,
            "{bytes} bytes not downloaded in {limit:?}: {:?} of them; server socket {:?}",
            download.as_ref().map(ClientStream::bytes),
            server_io.stats()
        );
        let moved = server.drive(server_io, &mut stx) + client.drive(client_io, &mut ctx);
        perf.poll(server);
        while let Some(e) = client.poll_event() {
            match e {
                Event::Established { .. } => {
                    let id = client.open_bidi(conn).unwrap();
                    download = Some(ClientStream::new(id, MODE_SOURCE, bytes));
                }
                Event::Closed { reason, .. } => panic!("closed: {reason}"),
            }
        }
        if let Some(d) = download.as_mut() {
            d.poll(client, conn, &mut scratch);
        }
        if moved == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    assert!(
        download.unwrap().is_correct(),
        "{bytes} bytes of the pattern"
    );
    conn
}

#[test]
fn a_server_sends_what_the_path_carries_not_what_the_peer_offers() {
    let _link = Link::up();
    let dir = common::cluster("pathmtu");
    let mut server_io = KernelUdp::bind(
        SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 1), 0),
        big_socket(),
    )
    .unwrap();
    let mut client_io = bind_in(
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
    let node = |name| QuicConfig {
        max_udp_payload: BIG,
        discover_pmtu: false,
        ..common::perf_node_config(&dir, name)
    };
    let mut server = Endpoint::server(node("server"), 0, BIG).unwrap();
    let mut client = Endpoint::client(node("client"), 0, BIG).unwrap();

    download(
        &mut client,
        &mut client_io,
        &mut server,
        &mut server_io,
        &mut PerfServer::new(),
        4 << 20,
        Duration::from_secs(20),
    );
    let sent = server_io.stats();
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
fn connections_find_a_path_narrower_than_both_ends_links() {
    let _path = NarrowPath::up();
    let dir = common::cluster("narrowpath");
    let mut client_io = bind_in(
        "ainfnpa",
        SocketAddrV4::new(Ipv4Addr::new(10, 60, 1, 2), 0),
        big_socket(),
    );
    let mut server_io = bind_in(
        "ainfnpb",
        SocketAddrV4::new(Ipv4Addr::new(10, 60, 2, 2), 0),
        big_socket(),
    );
    // Each end's own link says 1500: the route lookups cannot see the
    // narrow middle.
    assert_eq!(client_io.max_payload_to(server_io.local_addr()), 1472);
    assert_eq!(server_io.max_payload_to(client_io.local_addr()), 1472);
    let node = |name| QuicConfig {
        max_udp_payload: BIG,
        ..common::perf_node_config(&dir, name)
    };
    assert!(node("client").discover_pmtu, "PMTUD is on by default");
    let mut server = Endpoint::server(node("server"), 0, BIG).unwrap();
    let mut client = Endpoint::client(node("client"), 0, BIG).unwrap();

    let mut perf = PerfServer::new();
    download(
        &mut client,
        &mut client_io,
        &mut server,
        &mut server_io,
        &mut perf,
        32 << 20,
        Duration::from_secs(20),
    );
    assert!(
        NarrowPath::too_big_drops() > 0,
        "the probes above the path's size were dropped in the middle"
    );
    // The server, which sent the data, settled on the path's size: its
    // search (RFC 8899's binary search from 1472 down to QUIC's 1200-byte
    // floor) ends only when a size is acknowledged and one byte more is
    // not; while it searches, this reads the size being probed.
    let served = perf.connections()[0];
    let size = server
        .connection_mut(served)
        .unwrap()
        .max_send_udp_payload_size();
    assert_eq!(
        size, NARROW_PAYLOAD,
        "the server sends {size}-byte datagrams over a {NARROW_PAYLOAD}-byte path"
    );
}
