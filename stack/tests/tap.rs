//! The stack on net_tap against the Linux kernel on the other side: ARP
//! both ways, ping both ways, UDP echo byte-exact for every size up to the
//! MTU, many flows at once, and no mbuf leak.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4};

use common::*;
use stack::counters::DropReason;
use stack::io::dpdk::UdpMbuf;
use stack::io::Datagram;
use stack::runtime::{
    Echo, PingConfig, PingState, Pinger, RuntimeConfig, Services, ServicesApp, UdpHandler,
};

#[test]
fn kernel_pings_us_and_udp_echo_is_byte_exact_for_every_size() {
    let eal = eal("0");
    let (us, kernel) = (Ipv4Addr::new(10, 81, 0, 2), Ipv4Addr::new(10, 81, 0, 1));
    let cfg = RuntimeConfig::new("net_tap0,iface=ainftap81", us, 24);
    let run = Running::start(&eal, &cfg, |_| {
        let mut s = Services::new();
        s.listen(7, Box::new(Echo));
        s
    });
    tap_up("ainftap81", kernel, 24);

    let ping = sh_out(&format!("ping -c 3 -i 0.2 -W 2 {us}"));
    assert!(ping.contains("3 received"), "ping:\n{ping}");
    let neigh = sh_out(&format!("ip neigh show {us} dev ainftap81"));
    let mac = stack::wire::EthernetAddress(run.mac).to_string();
    assert!(neigh.contains(&mac), "kernel resolved us to {mac}: {neigh}");

    let sock = udp_socket(kernel);
    let to = SocketAddrV4::new(us, 7);
    for n in 1..=1472 {
        echo_once(&sock, to, &pattern(n, n as u8));
    }
    let report = run.finish();
    assert!(report.total.icmp_echo_replies >= 3);
    assert!(report.total.udp_out >= 1472);
    assert_eq!(report.total.dropped(DropReason::BadChecksum), 0);
    assert_eq!(report.mbufs_in_use_after_close, 0, "mbuf leak");
}

/// The other direction: our stack pings the kernel (resolving it by ARP
/// first) and matches each reply to its request.
#[test]
fn we_ping_the_kernel_and_match_its_replies() {
    let eal = eal("0");
    let (us, kernel) = (Ipv4Addr::new(10, 80, 0, 2), Ipv4Addr::new(10, 80, 0, 1));
    let cfg = RuntimeConfig::new("net_tap0,iface=ainftap80", us, 24);
    let ping = PingConfig {
        target: kernel,
        count: None,
        interval: std::time::Duration::from_millis(50),
        data_len: 56,
    };
    let state = PingState::new(ping, 0x5eed, None);
    let shared = state.clone();
    let run = Running::start_apps(&eal, &cfg, move |i| {
        Pinger::new(
            ServicesApp::new(Services::new()),
            Some(shared.clone()),
            i == 0,
        )
    });
    tap_up("ainftap80", kernel, 24);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while state.lock().unwrap().replies.len() < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            state.lock().unwrap().summary()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let report = run.finish();
    let s = state.lock().unwrap();
    let seqs: Vec<u16> = s.replies.iter().map(|r| r.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "in order, once each: {seqs:?}"
    );
    for r in &s.replies {
        assert_eq!((r.from, r.data_len), (kernel, 56), "{r:?}");
        assert!(r.rtt < std::time::Duration::from_secs(1), "{r:?}");
    }
    assert_eq!(s.unmatched, 0);
    assert!(s.summary().contains("received"), "{}", s.summary());
    // Our requests went out only once the kernel's MAC was known.
    assert!(report.total.arp_requests_out >= 2, "{report:?}");
    assert_eq!(report.mbufs_in_use_after_close, 0, "mbuf leak");
}

/// Answers with the payload reversed: a reply built from scratch (new
/// headers, next hop from the neighbour cache), unlike the echo's turnaround.
struct Reverse;

impl UdpHandler<UdpMbuf> for Reverse {
    fn on_datagram(&mut self, mut d: UdpMbuf, out: &mut Vec<UdpMbuf>) {
        d.payload_mut().reverse();
        out.push(d);
    }
}

#[test]
fn we_resolve_the_kernel_by_arp_when_it_never_asks() {
    let eal = eal("0");
    let (us, kernel) = (Ipv4Addr::new(10, 82, 0, 2), Ipv4Addr::new(10, 82, 0, 1));
    let cfg = RuntimeConfig::new("net_tap0,iface=ainftap82", us, 24);
    let run = Running::start(&eal, &cfg, |_| {
        let mut s = Services::new();
        s.listen(7, Box::new(Reverse));
        s
    });
    tap_up("ainftap82", kernel, 24);
    // The kernel knows us statically, so it sends no ARP request we could
    // learn from: our echo reply must resolve the kernel's MAC itself.
    let mac = stack::wire::EthernetAddress(run.mac);
    sh(&format!(
        "ip neigh replace {us} lladdr {mac} nud permanent dev ainftap82"
    ));
    let sock = udp_socket(kernel);
    sock.send_to(b"resolve me", SocketAddrV4::new(us, 7))
        .unwrap();
    let mut buf = [0u8; 64];
    let (n, _) = recv(&sock, &mut buf).expect("reply after our ARP resolution");
    assert_eq!(&buf[..n], b"em evloser");
    let report = run.finish();
    // One request is the gratuitous announcement at port up; the rest
    // asked for the kernel's address.
    assert!(report.total.arp_requests_out >= 2, "we asked: {report:?}");
    assert_eq!(report.total.dropped(DropReason::Unresolved), 0);
    assert_eq!(report.mbufs_in_use_after_close, 0, "mbuf leak");
}

#[test]
fn many_flows_at_once_each_get_their_own_bytes_back() {
    let eal = eal("0");
    let (us, kernel) = (Ipv4Addr::new(10, 83, 0, 2), Ipv4Addr::new(10, 83, 0, 1));
    let cfg = RuntimeConfig::new("net_tap0,iface=ainftap83", us, 24);
    let run = Running::start(&eal, &cfg, |_| {
        let mut s = Services::new();
        s.listen(9000, Box::new(Echo));
        s
    });
    tap_up("ainftap83", kernel, 24);
    let to = SocketAddrV4::new(us, 9000);
    let socks: Vec<_> = (0..32).map(|_| udp_socket(kernel)).collect();
    echo_once(&socks[0], to, b"warm up ARP");
    // Every flow sends before any reads: the echoes interleave on the wire.
    for round in 0..20u8 {
        for (i, s) in socks.iter().enumerate() {
            s.send_to(&pattern(64 + i * 40, round ^ i as u8), to)
                .unwrap();
        }
        let mut buf = [0u8; 2048];
        for (i, s) in socks.iter().enumerate() {
            let (n, _) = recv(s, &mut buf).expect("echo of a flow");
            assert_eq!(&buf[..n], &pattern(64 + i * 40, round ^ i as u8)[..]);
        }
    }
    let report = run.finish();
    assert_eq!(report.total.dropped(DropReason::NoListener), 0);
    assert_eq!(report.mbufs_in_use_after_close, 0, "mbuf leak");
}

#[test]
fn impairment_on_a_real_port_drops_what_it_says() {
    let eal = eal("0");
    let (us, kernel) = (Ipv4Addr::new(10, 84, 0, 2), Ipv4Addr::new(10, 84, 0, 1));
    let mut cfg = RuntimeConfig::new("net_tap0,iface=ainftap84", us, 24);
    cfg.impair = Some("loss=0.5,seed=3".parse().unwrap());
    let run = Running::start(&eal, &cfg, |_| {
        let mut s = Services::new();
        s.listen(7, Box::new(Echo));
        s
    });
    tap_up("ainftap84", kernel, 24);
    let sock = udp_socket(kernel);
    sock.set_read_timeout(Some(std::time::Duration::from_millis(20)))
        .unwrap();
    let to = SocketAddrV4::new(us, 7);
    echo_once(&sock, to, b"warm up ARP"); // retries until one gets through
    let mut buf = [0u8; 64];
    while recv(&sock, &mut buf).is_ok() {} // late copies of the warm-up
    let mut echoed = 0;
    for i in 0..400u32 {
        sock.send_to(&i.to_be_bytes(), to).unwrap();
        if recv(&sock, &mut buf).is_ok() {
            echoed += 1;
        }
    }
    let report = run.finish();
    let dropped = report.total.dropped(DropReason::Impaired);
    assert!(
        (140..=260).contains(&echoed),
        "half of 400 echoed: {echoed}"
    );
    assert!(dropped >= 140, "impaired drops counted: {dropped}");
    assert_eq!(report.mbufs_in_use_after_close, 0, "mbuf leak");
}
