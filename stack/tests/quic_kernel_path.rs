//! QUIC over kernel UDP on a real link with a 1500-byte MTU, to a client
//! that offers to take far bigger datagrams than that link carries (as
//! aioquic does: 65527 bytes; here our own endpoint configured for 32 KiB).
//! A server that has not yet seen the path must send what the path
//! carries, not what the peer offers: kernel UDP sends are DF, so a bigger
//! datagram fails with EMSGSIZE every time it is retransmitted and the
//! transfer crawls.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use stack::io::kernel::{KernelUdp, KernelUdpConfig};
use stack::io::PacketIo;
use stack::quic::perf::{ClientStream, PerfServer, MODE_SOURCE};
use stack::quic::{Endpoint, Event, QuicConfig};

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

    /// A kernel UDP socket bound inside the namespace (it stays there).
    fn bind_inside(&self, at: SocketAddrV4, cfg: KernelUdpConfig) -> KernelUdp {
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = std::fs::File::open("/run/netns/ainfpmns").unwrap();
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                KernelUdp::bind(at, cfg).unwrap()
            })
            .join()
            .unwrap()
        })
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        common::sh("ip link del ainfpm0 2>/dev/null; ip netns del ainfpmns 2>/dev/null; true");
    }
}

#[test]
fn a_server_sends_what_the_path_carries_not_what_the_peer_offers() {
    let link = Link::up();
    let dir = common::cluster("pathmtu");
    // Both ends allow 32 KiB datagrams, as ainftp-perf's server does when
    // it binds before any peer is known (loopback carries them), and the
    // client says so in its transport parameters.
    let big = KernelUdpConfig {
        max_payload: 32 << 10,
        ..KernelUdpConfig::default()
    };
    let mut server_io = KernelUdp::bind(
        SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 1), 0),
        big.clone(),
    )
    .unwrap();
    let mut client_io = link.bind_inside(
        SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 2), 0),
        big.clone(),
    );
    assert_eq!(server_io.max_payload(), 32 << 10);
    assert_eq!(
        server_io.max_payload_to(client_io.local_addr()),
        1472,
        "the route to the client is the 1500-byte veth"
    );
    let node = |name| QuicConfig {
        max_udp_payload: big.max_payload,
        ..common::perf_node_config(&dir, name)
    };
    let mut server = Endpoint::server(node("server"), 0, big.max_payload).unwrap();
    let mut client = Endpoint::client(node("client"), 0, big.max_payload).unwrap();
    let mut perf = PerfServer::new();

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
    let deadline = Instant::now() + Duration::from_secs(20);
    while !download.as_ref().is_some_and(ClientStream::is_done) {
        assert!(
            Instant::now() < deadline,
            "4 MiB not downloaded in 20 s: {:?} of it; server socket {:?}",
            download.as_ref().map(ClientStream::bytes),
            server_io.stats()
        );
        let moved = server.drive(&mut server_io, &mut stx) + client.drive(&mut client_io, &mut ctx);
        perf.poll(&mut server);
        while let Some(e) = client.poll_event() {
            match e {
                Event::Established { .. } => {
                    let id = client.open_bidi(conn).unwrap();
                    download = Some(ClientStream::new(id, MODE_SOURCE, 4 << 20));
                }
                Event::Closed { reason, .. } => panic!("closed: {reason}"),
            }
        }
        if let Some(d) = download.as_mut() {
            d.poll(&mut client, conn, &mut scratch);
        }
        if moved == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    assert!(download.unwrap().is_correct(), "4 MiB of the pattern");
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
