//! A connection keeps its lcore when its packets arrive on another one.
//! Our QUIC server runs on two lcores over net_tap; a kernel-UDP client
//! (our endpoint) sits behind a NAT in this namespace that rebinds it to
//! new outside ports while the connection is quiet, as a NAT does when an
//! idle mapping expires. Each new port is a new flow, which the steering
//! (software RSS by hash, or the kernel picking net_tap's rx queue) may
//! put on the lcore that does not own the connection. The stack must hand
//! such packets to the owner by connection ID; without that they are
//! "unknown connection" there and the transfer hangs.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use common::*;
use stack::io::kernel::{KernelDatagram, KernelUdp, KernelUdpConfig};
use stack::quic::perf::{ClientStream, PerfServer, MODE_SOURCE};
use stack::quic::{ConnHandle, Endpoint, Event};
use stack::rss::{udp4_hash, QueueMap, DEFAULT_KEY};
use stack::runtime::{RuntimeConfig, SteeringMode};

const SERVER_PORT: u16 = 4433;

/// Our client endpoint on a kernel socket, driven from the test thread.
struct Client {
    ep: Endpoint<KernelDatagram>,
    io: KernelUdp,
}

impl Client {
    fn drive(&mut self) {
        let mut tx = Vec::new();
        if self.ep.drive(&mut self.io, &mut tx) == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
        while let Some(e) = self.ep.poll_event() {
            if let Event::Closed { reason, .. } = e {
                panic!("closed: {reason}");
            }
        }
    }

    fn connect(&mut self, server: SocketAddrV4) -> ConnHandle {
        let conn = self
            .ep
            .connect(self.io.local_addr(), server, Some("server"))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.ep.is_established(conn) {
            assert!(Instant::now() < deadline, "no handshake in 20 s");
            self.drive();
        }
        conn
    }

    /// Download `bytes` of the perf pattern on a new stream, within 10 s.
    fn download(&mut self, conn: ConnHandle, bytes: u64, what: &str) {
        let id = self.ep.open_bidi(conn).unwrap();
        let mut stream = ClientStream::new(id, MODE_SOURCE, bytes);
        let mut scratch = vec![0u8; 64 << 10];
        let deadline = Instant::now() + Duration::from_secs(10);
        while !stream.is_done() {
            assert!(
                Instant::now() < deadline,
                "{what}: {} of {bytes} bytes in 10 s",
                stream.bytes()
            );
            self.drive();
            stream.poll(&mut self.ep, conn, &mut scratch);
        }
        assert!(stream.is_correct(), "{what}: the pattern");
    }

    /// Keep the connection alive, quiet, for `d`.
    fn idle(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.drive();
        }
    }
}

/// The kernel's NAT for our client: packets from its socket's port to the
/// server leave from `outside`, replies to `outside` come back to it
/// (stateless, both ways). Replacing the table rebinds the client.
struct Nat {
    table: String,
    server: Ipv4Addr,
    inside: u16,
}

impl Nat {
    fn map_to(&self, outside: u16) {
        let (t, s, inside) = (&self.table, self.server, self.inside);
        sh(&format!(
            "nft -f - <<'EOF'
table ip {t}
delete table ip {t}
table ip {t} {{
    chain out {{
        type filter hook output priority -300;
        ip daddr {s} udp sport {inside} udp sport set {outside} notrack
    }}
    chain pre {{
        type filter hook prerouting priority -300;
        ip saddr {s} udp dport {outside} udp dport set {inside} notrack
    }}
}}
EOF"
        ));
    }
}

impl Drop for Nat {
    fn drop(&mut self) {
        let _ = std::process::Command::new("nft")
            .args(["delete", "table", "ip", &self.table])
            .status();
    }
}

type ServerApp = stack::quic::lcore::EndpointApp<stack::io::dpdk::UdpMbuf, PerfServer>;

/// Our server on lcores 0-1 over net_tap `iface` at 10.`subnet`.0.2, and
/// our client at .1 behind its NAT.
struct Setup {
    running: Running<ServerApp>,
    client: Client,
    nat: Nat,
    server: SocketAddrV4,
    client_ip: Ipv4Addr,
    _dir: ClusterDir,
}

impl Setup {
    fn new(mode: SteeringMode, iface: &str, subnet: u8) -> Setup {
        let eal = eal("0-1");
        let us = Ipv4Addr::new(10, subnet, 0, 2);
        let kernel = Ipv4Addr::new(10, subnet, 0, 1);
        let mut cfg = RuntimeConfig::new(&format!("net_tap0,iface={iface}"), us, 24);
        cfg.steering = mode;
        cfg.payload_owner = Some(stack::quic::cid::owner_of_datagram);
        let dir = cluster(iface);
        let server_dir = dir.clone();
        let running = Running::start_apps(&eal, &cfg, move |i| {
            let config = perf_node_config(&server_dir, "server");
            let ep = Endpoint::server(config, i as u8, MAX_PAYLOAD).expect("server config");
            ServerApp::new(ep, PerfServer::new())
        });
        tap_up(iface, kernel, 24);
        // The kernel then sums each UDP datagram before the NAT rewrites
        // its port, and nftables updates that sum (with the sum left to
        // the device, or with GSO, the rewritten datagrams arrive with bad
        // checksums).
        sh(&format!("ethtool -K {iface} tx off >/dev/null"));
        let io = KernelUdp::bind(
            SocketAddrV4::new(kernel, 0),
            KernelUdpConfig {
                max_payload: MAX_PAYLOAD,
                gso: false,
                ..KernelUdpConfig::default()
            },
        )
        .unwrap();
        let nat = Nat {
            table: format!("ainfho{subnet}"),
            server: us,
            inside: io.local_addr().port(),
        };
        let config = perf_node_config(&dir, "client");
        Setup {
            running,
            client: Client {
                ep: Endpoint::client(config, 0, MAX_PAYLOAD).unwrap(),
                io,
            },
            nat,
            server: SocketAddrV4::new(us, SERVER_PORT),
            client_ip: kernel,
            _dir: dir,
        }
    }

    /// A new connection from outside port `outside`, which downloads once.
    fn connect_from(&mut self, outside: u16) -> ConnHandle {
        self.nat.map_to(outside);
        let conn = self.client.connect(self.server);
        self.client.download(conn, 1 << 20, "before any rebinding");
        conn
    }

    /// While `conn` is quiet, the NAT rebinds the client to `outside`;
    /// then it downloads again. (A rebinding in mid-transfer is
    /// `quic_kernel_path.rs`'s.)
    fn rebind(&mut self, conn: ConnHandle, outside: u16) {
        self.client.idle(Duration::from_millis(100));
        self.nat.map_to(outside);
        self.client
            .download(conn, 1 << 20, &format!("rebound to port {outside}"));
    }

    /// Packets the server's lcores handed to one another so far.
    fn handed_over(&self) -> u64 {
        self.running
            .counters
            .iter()
            .map(|c| c.snapshot().steered)
            .sum()
    }

    /// Stop the server; where it last saw each connection's client.
    fn finish(self) -> Vec<SocketAddrV4> {
        let (_, apps) = self.running.finish_apps();
        apps.iter()
            .flat_map(|a| {
                let ep = &a.endpoint;
                a.service.connections().iter().filter_map(|&h| ep.peer(h))
            })
            .collect()
    }
}

/// Software steering puts a flow on the lcore its hash names: rebind the
/// client to a port that hashes to lcore 0, then to one that hashes to
/// lcore 1. One of them is not the connection's lcore, whichever that is.
#[test]
fn software_steering_sends_a_rebound_connection_to_its_own_lcore() {
    let mut s = Setup::new(SteeringMode::Software, "ainfho64", 64);
    let map = QueueMap {
        queues: 2,
        reta_size: 0,
    };
    let (client, server) = (s.client_ip, *s.server.ip());
    let lcore_of = |port| map.queue_of(udp4_hash(&DEFAULT_KEY, client, server, port, SERVER_PORT));
    let conn = s.connect_from(41_000);
    let mut last = 0;
    for lcore in 0..2 {
        last = (41_001..)
            .find(|&p| lcore_of(p) == lcore)
            .expect("a port for each lcore");
        s.rebind(conn, last);
    }
    let seen = s.finish();
    assert_eq!(
        seen,
        [SocketAddrV4::new(client, last)],
        "the server follows the client to its last port"
    );
}

/// With a queue per lcore, net_tap's kernel side picks the queue of a new
/// flow by its own hash. Rebind one connection until a new port lands on
/// the other lcore (a hand-off is counted); each does with probability
/// 1/2, so 28 tries all miss with probability 2^-28. That is more
/// rebindings than the path table holds (`PATHS_PER_CONNECTION`): the
/// server evicts the paths the connection left.
#[test]
fn a_rebound_connection_is_handed_to_its_lcore_from_the_queue_the_kernel_picked() {
    let mut s = Setup::new(SteeringMode::Rss, "ainfho65", 65);
    let client = s.client_ip;
    let conn = s.connect_from(42_000);
    let mut last = 42_000;
    for port in 42_001..=42_028 {
        s.rebind(conn, port);
        last = port;
        if s.handed_over() > 0 {
            break;
        }
    }
    let handed = s.handed_over();
    let seen = s.finish();
    assert!(
        handed > 0,
        "rebound {} times; the kernel put no new port on the other lcore's queue",
        last - 42_000
    );
    assert_eq!(
        seen,
        [SocketAddrV4::new(client, last)],
        "the server follows the client to its last port"
    );
}
