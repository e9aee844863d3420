//! Thousands of QUIC connections through our DPDK stack: the perf server
//! on net_tap, clients on the kernel side of the TAP device (our endpoint
//! over kernel UDP) opening 8 at a time and closing each once established.
//! Every connection completes, the server keeps no state afterwards, and
//! every mbuf is back in the pool. A client that closes this early can
//! find its close unsendable (quiche sends an application close only in
//! 1-RTT packets; see `CLOSE_DATAGRAMS` in the endpoint): the server then
//! forgets the connection at its idle timeout, 2 s here.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use common::{perf_node_config, start_perf_server};
use stack::io::kernel::{KernelUdp, KernelUdpConfig};
use stack::io::PacketIo;
use stack::quic::{Endpoint, Event, QuicConfig};

const CONNECTIONS: usize = 2000;
const AT_ONCE: usize = 8;

#[test]
fn two_thousand_connections_through_dpdk_leave_no_mbuf_and_no_state() {
    let eal = common::eal("0");
    let us = Ipv4Addr::new(10, 72, 0, 2);
    let idle = Duration::from_secs(2);
    let (running, dir) = start_perf_server(&eal, "ainfqc0", us, "churn", Some(idle));
    let kernel = Ipv4Addr::new(10, 72, 0, 1);
    let mut io = KernelUdp::bind(SocketAddrV4::new(kernel, 0), KernelUdpConfig::default())
        .expect("bind on the kernel side of the tap");
    let config = QuicConfig {
        idle_timeout: idle,
        ..perf_node_config(&dir, "client")
    };
    let mut client = Endpoint::client(config, 0, io.max_payload()).expect("client config");
    let (local, server) = (io.local_addr(), SocketAddrV4::new(us, 4433));

    let mut tx = Vec::new();
    let mut open = Vec::new();
    let (mut started, mut established, mut closed) = (0, 0, 0);
    let deadline = Instant::now() + Duration::from_secs(240);
    while closed < CONNECTIONS {
        assert!(
            Instant::now() < deadline,
            "{closed} of {CONNECTIONS} closed ({established} established) in time"
        );
        while open.len() < AT_ONCE && started < CONNECTIONS {
            open.push(client.connect(local, server, Some("server")).unwrap());
            started += 1;
        }
        if client.drive(&mut io, &mut tx) == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
        while let Some(e) = client.poll_event() {
            match e {
                Event::Established { conn, .. } => {
                    established += 1;
                    client.close(conn, 0, b"churn").unwrap();
                }
                Event::Closed { conn, .. } => {
                    open.retain(|&c| c != conn);
                    closed += 1;
                }
            }
        }
    }
    assert_eq!(established, CONNECTIONS, "every handshake completed");

    // Past the idle timeout the server has forgotten every connection,
    // including any whose close could not be sent.
    eprintln!(
        "closes that could not be sent: {}",
        client.stats().closes_unsent
    );
    std::thread::sleep(idle + Duration::from_secs(1));
    let (report, apps) = running.finish_apps();
    let ep = &apps[0].endpoint;
    assert!(
        ep.stats().accepted >= CONNECTIONS as u64,
        "{:?}",
        ep.stats()
    );
    assert_eq!(
        ep.connections(),
        0,
        "no connection state left: {:?}",
        ep.stats()
    );
    assert_eq!(ep.handshakes_in_progress(), 0);
    assert_eq!(report.mbufs_in_use_after_close, 0, "no mbuf leaked");
}
