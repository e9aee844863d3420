//! The stack on an arena pool (`--mbuf-arena`): over a real net_tap port,
//! datagrams from a kernel socket arrive with their payload inside the
//! gpudirect arena, byte-exact, and go back out of it; every mbuf returns
//! to the pool when the port closes. Needs root (CI is root). One test per
//! file: EAL starts once per process.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use stack::io::{Datagram, PacketIo};
use stack::runtime::{Runtime, RuntimeConfig};
use tools::arena_pool::ArenaPool;
use tools::eal_setup::{self, EalOptions};

const IFACE: &str = "arenastk0";
const UDP_PORT: u16 = 4790;

fn sh(cmd: &str) {
    let st = Command::new("sh").args(["-c", cmd]).status().unwrap();
    assert!(st.success(), "{cmd}");
}

/// Datagram `k` of `len` bytes: distinct per datagram and per offset.
fn payload(k: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + k * 13) as u8).collect()
}

#[test]
fn stack_on_an_arena_pool_receives_into_the_arena_and_echoes_byte_exact() {
    let eal = eal_setup::init(&EalOptions {
        lcores: &[0],
        pci: &[],
        extra: &[],
    })
    .expect("EAL (root and hugepages: scripts/setup-host.sh)");
    let arena = ArenaPool::new(&eal, 4095, dpdk_ffi::DEFAULT_DATA_ROOM).unwrap();
    let (ours, kernel_ip) = (Ipv4Addr::new(10, 93, 0, 2), Ipv4Addr::new(10, 93, 0, 1));
    let mut cfg = RuntimeConfig::new(&format!("net_tap_as0,iface={IFACE}"), ours, 24);
    cfg.pool = Some(arena.pool().clone());
    // Buffers too small for the MTU's frames are refused before the port
    // opens (the stack handles single-segment packets only).
    cfg.mtu = Some(9000);
    let err = Runtime::start(&eal, &cfg)
        .err()
        .expect("a 2176-byte pool at MTU 9000");
    assert!(err.to_string().contains("single-segment"), "{err}");
    // An arena sized for the MTU (what --mbuf-arena --mtu makes) passes
    // that check; net_tap itself then refuses frames over 1522 bytes.
    let room = stack::runtime::data_room("net_tap_as0", Some(9000)).unwrap();
    let jumbo = ArenaPool::new(&eal, 4095, room).unwrap();
    assert!(jumbo.pool().data_room() >= room);
    let mut jumbo_cfg = cfg.clone();
    jumbo_cfg.pool = Some(jumbo.pool().clone());
    let err = Runtime::start(&eal, &jumbo_cfg)
        .err()
        .expect("net_tap has no jumbo frames");
    assert!(err.to_string().contains("MTU of 9000"), "{err}");
    drop(jumbo_cfg);
    drop(jumbo);
    cfg.mtu = None;
    let rt = Runtime::start(&eal, &cfg).unwrap();
    assert!(
        rt.port().dma_mapped_runs().is_some(),
        "the port maps the arena for its device"
    );
    let mut stack = rt.into_inline(UDP_PORT).unwrap();
    sh(&format!(
        "echo 1 > /proc/sys/net/ipv6/conf/{IFACE}/disable_ipv6; \
         ip addr add {kernel_ip}/24 dev {IFACE} && ip link set {IFACE} up"
    ));
    let sock = UdpSocket::bind(SocketAddrV4::new(kernel_ip, 0)).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(1)))
        .unwrap();
    let to = SocketAddrV4::new(ours, UDP_PORT);

    let sizes: Vec<usize> = vec![1, 2, 63, 64, 65, 500, 1024, 1471, stack.max_payload()];
    let mut echoed = vec![false; sizes.len()];
    let (mut rx, mut tx) = (Vec::new(), Vec::new());
    let mut buf = [0u8; 2048];
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut next = 0;
    while echoed.iter().any(|e| !e) {
        assert!(Instant::now() < deadline, "echoed so far: {echoed:?}");
        // ARP is answered inside the stack; resend until echoed.
        if next < sizes.len() * 50 {
            let k = next % sizes.len();
            if !echoed[k] {
                sock.send_to(&payload(k, sizes[k]), to).unwrap();
            }
            next += 1;
        }
        stack.recv_burst(&mut rx, 32);
        for d in rx.drain(..) {
            let p = d.payload();
            assert!(
                arena.arena().contains(p.as_ptr()) && arena.arena().contains(&p[p.len() - 1]),
                "payload at {:p} is outside the arena",
                p.as_ptr()
            );
            let mut out = stack.alloc().expect("a buffer to echo from");
            out.set_len(p.len());
            out.payload_mut().copy_from_slice(p);
            out.set_peer(d.peer());
            out.set_local_port(UDP_PORT);
            assert!(arena.arena().contains(out.payload().as_ptr()));
            tx.push(out);
        }
        while !tx.is_empty() {
            stack.send_burst(&mut tx);
            stack.poll(Instant::now());
        }
        stack.poll(Instant::now());
        while let Ok((n, _)) = sock.recv_from(&mut buf) {
            let k = sizes
                .iter()
                .enumerate()
                .position(|(k, &len)| len == n && buf[..n] == payload(k, len)[..])
                .unwrap_or_else(|| panic!("an echo of {n} bytes matches no datagram sent"));
            echoed[k] = true;
        }
    }
    assert_eq!(stack.close(), 0, "every mbuf went back to the arena pool");
}
