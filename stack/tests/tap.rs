//! The stack on net_tap against the Linux kernel on the other side: ARP
//! both ways, ping both ways, UDP echo byte-exact for every size up to the
//! MTU, many flows at once, and no mbuf leak.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use stack::counters::DropReason;
use stack::io::dpdk::UdpMbuf;
use stack::io::{CountedIo, Datagram, PacketIo};
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

/// Our runtime with `services` on every lcore, lcore 0 pinging `target`
/// every 50 ms; the ping state to read the replies from.
fn start_pinging(
    eal: &dpdk_ffi::Eal,
    cfg: &RuntimeConfig,
    target: Ipv4Addr,
    services: fn() -> Services<UdpMbuf>,
) -> (Running<Pinger<ServicesApp<UdpMbuf>>>, Arc<Mutex<PingState>>) {
    let ping = PingConfig {
        target,
        count: None,
        interval: Duration::from_millis(50),
        data_len: 56,
    };
    let state = PingState::new(ping, 0x5eed);
    let shared = state.clone();
    let run = Running::start_apps(eal, cfg, move |i| {
        Pinger::new(
            ServicesApp::new(services()),
            Some(shared.clone()),
            i == 0,
            None,
        )
    });
    (run, state)
}

/// Wait (10 s at most) until `n` pings were answered.
fn wait_for_replies(state: &Mutex<PingState>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while (state.lock().unwrap().received as usize) < n {
        assert!(
            Instant::now() < deadline,
            "{}",
            state.lock().unwrap().summary()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The other direction: our stack pings the kernel (resolving it by ARP
/// first) and matches each reply to its request.
#[test]
fn we_ping_the_kernel_and_match_its_replies() {
    let eal = eal("0");
    let (us, kernel) = (Ipv4Addr::new(10, 80, 0, 2), Ipv4Addr::new(10, 80, 0, 1));
    let cfg = RuntimeConfig::new("net_tap0,iface=ainftap80", us, 24);
    let (run, state) = start_pinging(&eal, &cfg, kernel, Services::new);
    tap_up("ainftap80", kernel, 24);
    wait_for_replies(&state, 5);
    let report = run.finish();
    let s = state.lock().unwrap();
    let seqs: Vec<u16> = s.recent.iter().map(|r| r.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "in order, once each: {seqs:?}"
    );
    assert_eq!(s.recent.len() as u32, s.received);
    for r in &s.recent {
        assert_eq!((r.from, r.data_len), (kernel, 56), "{r:?}");
        assert!(r.rtt < Duration::from_secs(1), "{r:?}");
        assert!(s.rtt_min <= r.rtt && r.rtt <= s.rtt_max, "{r:?}");
    }
    assert_eq!(s.unmatched, 0);
    let line = s.summary();
    assert!(line.contains(&format!("{} received", s.received)), "{line}");
    // Besides the announcement at port up, we asked the kernel's MAC.
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

/// Replies built from scratch (not turned around) get their checksums
/// from the NIC where the port offers it (net_tap does) and in software
/// without: the kernel drops a UDP datagram with a wrong checksum, so the
/// reply arriving proves it right either way.
#[test]
fn we_resolve_the_kernel_by_arp_when_it_never_asks() {
    let eal = eal("0");
    let (us, kernel) = (Ipv4Addr::new(10, 82, 0, 2), Ipv4Addr::new(10, 82, 0, 1));
    for offload in [true, false] {
        let mut cfg = RuntimeConfig::new("net_tap0,iface=ainftap82", us, 24);
        cfg.checksum_offload = offload;
        let run = Running::start(&eal, &cfg, |_| {
            let mut s = Services::new();
            s.listen(7, Box::new(Reverse));
            s
        });
        assert_eq!(
            (run.features.tx_ip_checksum, run.features.tx_udp_checksum),
            (offload, offload),
            "net_tap offers both offloads; used only when asked"
        );
        tap_up("ainftap82", kernel, 24);
        // The kernel knows us statically, so it sends no ARP request we
        // could learn from: our echo reply must resolve the kernel's MAC.
        let mac = stack::wire::EthernetAddress(run.mac);
        sh(&format!(
            "ip neigh replace {us} lladdr {mac} nud permanent dev ainftap82"
        ));
        let sock = udp_socket(kernel);
        sock.send_to(b"resolve me", SocketAddrV4::new(us, 7))
            .unwrap();
        let mut buf = [0u8; 64];
        let (n, _) = recv(&sock, &mut buf).expect("reply after our ARP resolution");
        assert_eq!(&buf[..n], b"em evloser", "offload {offload}");
        let report = run.finish();
        // One request is the gratuitous announcement at port up; the rest
        // asked for the kernel's address.
        assert!(report.total.arp_requests_out >= 2, "we asked: {report:?}");
        assert_eq!(report.total.dropped(DropReason::Unresolved), 0);
        assert_eq!(report.mbufs_in_use_after_close, 0, "mbuf leak");
    }
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
    sock.set_read_timeout(Some(Duration::from_millis(20)))
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

/// Off the subnet through the gateway: the kernel side is our gateway and
/// also holds 192.0.2.1/32, an address outside our subnet. Our ping to it
/// and our UDP replies to it go to the gateway's MAC, and come back.
#[test]
fn outside_the_subnet_we_send_through_the_gateway() {
    let eal = eal("0");
    let (us, gw) = (Ipv4Addr::new(10, 69, 0, 2), Ipv4Addr::new(10, 69, 0, 1));
    let far = Ipv4Addr::new(192, 0, 2, 1);
    let mut cfg = RuntimeConfig::new("net_tap0,iface=ainftap69", us, 24);
    cfg.gateway = Some(gw);
    let (run, state) = start_pinging(&eal, &cfg, far, || {
        let mut s = Services::new();
        s.listen(7, Box::new(Reverse));
        s
    });
    tap_up("ainftap69", gw, 24);
    sh(&format!("ip addr add {far}/32 dev ainftap69"));
    // Answered pings: the gateway's MAC is known from here on.
    wait_for_replies(&state, 3);
    let sock = udp_socket(far);
    sock.send_to(b"via the gateway", SocketAddrV4::new(us, 7))
        .unwrap();
    let mut buf = [0u8; 64];
    let (n, _) = recv(&sock, &mut buf).expect("a reply routed through the gateway");
    assert_eq!(&buf[..n], b"yawetag eht aiv");
    let report = run.finish();
    assert!(state.lock().unwrap().recent.iter().all(|r| r.from == far));
    assert_eq!(report.total.dropped(DropReason::NoRoute), 0);
    assert_eq!(report.mbufs_in_use_after_close, 0, "mbuf leak");
}

/// Without a gateway, a reply for an address outside the subnet has no
/// route: dropped and counted, not sent to some guessed MAC.
#[test]
fn without_a_gateway_replies_off_the_subnet_are_dropped_as_no_route() {
    let eal = eal("0");
    let (us, kernel) = (Ipv4Addr::new(10, 68, 0, 2), Ipv4Addr::new(10, 68, 0, 1));
    let far = Ipv4Addr::new(192, 0, 2, 2);
    let cfg = RuntimeConfig::new("net_tap0,iface=ainftap68", us, 24);
    let run = Running::start(&eal, &cfg, |_| {
        let mut s = Services::new();
        s.listen(7, Box::new(Reverse));
        s
    });
    tap_up("ainftap68", kernel, 24);
    sh(&format!("ip addr add {far}/32 dev ainftap68"));
    let sock = udp_socket(far);
    let mut buf = [0u8; 64];
    for _ in 0..3 {
        sock.send_to(b"no way back", SocketAddrV4::new(us, 7))
            .unwrap();
        assert!(
            recv(&sock, &mut buf).is_err(),
            "a reply came without a route"
        );
    }
    let report = run.finish();
    assert!(report.total.udp_in >= 3, "{report:?}");
    assert_eq!(report.total.dropped(DropReason::NoRoute), 3, "{report:?}");
    assert_eq!(report.mbufs_in_use_after_close, 0, "mbuf leak");
}

/// On a VLAN (id 5). This kernel has no 802.1Q module, so its side of the
/// TAP device speaks through packet sockets (sending with pnet, reading
/// the tags with tests/tap/vlan_listen.py): tagged ARP, ping and UDP get
/// tagged replies, and the same UDP untagged or on VLAN 6 is dropped as
/// wrong_vlan.
#[test]
fn on_a_vlan_everything_runs_tagged() {
    use stack::wire::{
        ArpOperation, ArpRepr, ChecksumMode, EthernetAddress, EthernetRepr, Icmpv4Repr, Ipv4Repr,
        UdpRepr,
    };
    const IFACE: &str = "ainftap67";
    let eal = eal("0");
    let (us, them) = (Ipv4Addr::new(10, 67, 0, 2), Ipv4Addr::new(10, 67, 0, 1));
    let their_mac = EthernetAddress([2, 0, 0, 0, 0x67, 1]);
    let mut cfg = RuntimeConfig::new(&format!("net_tap0,iface={IFACE}"), us, 24);
    cfg.vlan = Some(5);
    let run = Running::start(&eal, &cfg, |_| {
        let mut s = Services::new();
        s.listen(7, Box::new(Echo));
        s
    });
    let our_mac = EthernetAddress(run.mac);
    // No IPv6 chatter from the kernel's side.
    sh(&format!(
        "echo 1 > /proc/sys/net/ipv6/conf/{IFACE}/disable_ipv6 && ip link set {IFACE} up"
    ));
    let iface = pnet_datalink::interfaces()
        .into_iter()
        .find(|i| i.name == IFACE)
        .expect("the TAP interface");
    let pnet_datalink::Channel::Ethernet(mut tx, _) =
        pnet_datalink::channel(&iface, pnet_datalink::Config::default()).unwrap()
    else {
        panic!("not an Ethernet channel")
    };
    // What we send, tag included, as the kernel's side receives it: our
    // three replies.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tap/vlan_listen.py");
    let mac_hex: String = our_mac
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let their_hex: String = their_mac
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut listener = std::process::Command::new("python3")
        .args([script, IFACE, &mac_hex, &their_hex, "3"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut lines =
        std::io::BufRead::lines(std::io::BufReader::new(listener.stdout.take().unwrap()));
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let frame = |dst: EthernetAddress, vlan: Option<u16>, ethertype: u16, l3: &[u8]| {
        let eth = EthernetRepr {
            src_addr: their_mac,
            dst_addr: dst,
            ethertype,
            vlan_id: vlan,
        };
        let mut f = vec![0u8; eth.header_len() + l3.len()];
        eth.emit(&mut f).unwrap();
        f[eth.header_len()..].copy_from_slice(l3);
        f
    };
    let ipv4 = |protocol: u8, l4: &[u8]| {
        let mut b = vec![0u8; 20 + l4.len()];
        b[20..].copy_from_slice(l4);
        Ipv4Repr {
            src_addr: them,
            dst_addr: us,
            protocol,
            payload_len: l4.len(),
            ttl: 64,
            ident: 1,
            dont_frag: true,
        }
        .emit(&mut b, ChecksumMode::Software)
        .unwrap();
        b
    };
    let udp = |payload: &[u8]| {
        let mut b = vec![0u8; 8 + payload.len()];
        b[8..].copy_from_slice(payload);
        let repr = UdpRepr {
            src_port: 4000,
            dst_port: 7,
        };
        repr.emit(&mut b, payload.len(), them, us, ChecksumMode::Software)
            .unwrap();
        ipv4(17, &b)
    };
    // The next frame from us: its VLAN ("none" untagged) and ethertype.
    let mut from_us = || lines.next().expect("a frame from us").unwrap();

    let arp = ArpRepr {
        operation: ArpOperation::Request,
        source_hardware_addr: their_mac,
        source_protocol_addr: them,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: us,
    };
    let mut a = vec![0u8; arp.buffer_len()];
    arp.emit(&mut a).unwrap();
    tx.send_to(
        &frame(EthernetAddress::BROADCAST, Some(5), 0x0806, &a),
        None,
    )
    .unwrap()
    .unwrap();
    assert_eq!(from_us(), "5 0806", "a tagged ARP reply");

    let echo = Icmpv4Repr::EchoRequest {
        ident: 0x67,
        seq_no: 1,
        data: b"tagged ping",
    };
    let mut e = vec![0u8; echo.buffer_len()];
    echo.emit(&mut e).unwrap();
    tx.send_to(&frame(our_mac, Some(5), 0x0800, &ipv4(1, &e)), None)
        .unwrap()
        .unwrap();
    assert_eq!(from_us(), "5 0800", "a tagged echo reply");

    for wrong in [None, Some(6)] {
        tx.send_to(&frame(our_mac, wrong, 0x0800, &udp(b"wrong vlan")), None)
            .unwrap()
            .unwrap();
    }
    tx.send_to(&frame(our_mac, Some(5), 0x0800, &udp(b"right vlan")), None)
        .unwrap()
        .unwrap();
    assert_eq!(from_us(), "5 0800", "a tagged UDP echo");
    assert!(listener.wait().unwrap().success());

    let report = run.finish();
    assert_eq!(report.total.dropped(DropReason::WrongVlan), 2, "{report:?}");
    assert_eq!(report.total.icmp_echo_replies, 1);
    assert_eq!(report.mbufs_in_use_after_close, 0, "mbuf leak");
}

/// Frames queued for many unresolved addresses all go when the answers
/// arrive in one burst: 20 addresses x 16 frames (the per-address queue)
/// is more than the 256 frames the backend holds for the NIC at once.
#[test]
fn frames_queued_for_many_addresses_all_go_when_they_resolve_at_once() {
    const ADDRESSES: u8 = 20;
    const PER_ADDRESS: usize = 16;
    const PORT: u16 = 46363;
    let eal = eal("0");
    let us = Ipv4Addr::new(10, 63, 0, 2);
    let cfg = RuntimeConfig::new("net_tap0,iface=ainftap63", us, 24);
    let mut stack = stack::runtime::Runtime::start(&eal, &cfg)
        .expect("runtime starts")
        .into_inline(PORT)
        .expect("one lcore");
    tap_up("ainftap63", Ipv4Addr::new(10, 63, 0, 1), 24);
    let targets: Vec<Ipv4Addr> = (0..ADDRESSES)
        .map(|i| Ipv4Addr::new(10, 63, 0, 10 + i))
        .collect();
    for ip in &targets {
        sh(&format!("ip addr add {ip}/24 dev ainftap63"));
    }
    // 320 datagrams at once overflow a socket's default receive buffer
    // (about 200 small ones) while its reader waits for a core.
    let sock = std::net::UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, PORT)).unwrap();
    nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBufForce, &(4 << 20))
        .expect("SO_RCVBUFFORCE (root)");
    sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let reader = std::thread::spawn(move || {
        let mut seen = std::collections::BTreeSet::new();
        let mut buf = [0u8; 64];
        while let Ok((n, _)) = recv(&sock, &mut buf) {
            seen.insert(buf[..n].to_vec());
        }
        seen
    });

    let mut out = Vec::new();
    for (a, ip) in targets.iter().enumerate() {
        for k in 0..PER_ADDRESS {
            let mut d = stack.alloc().expect("an mbuf");
            d.set_len(2);
            d.payload_mut().copy_from_slice(&[a as u8, k as u8]);
            d.set_peer(SocketAddrV4::new(*ip, PORT));
            out.push(d);
        }
    }
    while !out.is_empty() {
        assert!(stack.send_burst(&mut out) > 0, "the backend takes frames");
    }
    // Every ARP reply is in before the stack reads any: one burst.
    std::thread::sleep(Duration::from_millis(300));
    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        stack.recv_burst(&mut got, 64);
        got.clear();
        stack.poll(Instant::now());
    }
    let seen = reader.join().unwrap();
    let counters = stack.counters();
    assert_eq!(counters.dropped(DropReason::TxFull), 0, "{counters:?}");
    assert_eq!(counters.dropped(DropReason::Unresolved), 0, "{counters:?}");
    assert_eq!(
        seen.len(),
        ADDRESSES as usize * PER_ADDRESS,
        "the kernel got each frame"
    );
    assert_eq!(counters.udp_out, 320);
    // To an address nobody answers: 16 wait for ARP, the rest are dropped
    // and not counted as sent.
    let nobody = SocketAddrV4::new(Ipv4Addr::new(10, 63, 0, 99), PORT);
    let mut out: Vec<_> = (0..PER_ADDRESS + 4)
        .map(|_| {
            let mut d = stack.alloc().expect("an mbuf");
            d.set_len(1);
            d.set_peer(nobody);
            d
        })
        .collect();
    stack.send_burst(&mut out);
    let after = stack.counters();
    assert_eq!(
        after.udp_out - counters.udp_out,
        PER_ADDRESS as u64,
        "{after:?}"
    );
    assert_eq!(after.dropped(DropReason::Unresolved), 4, "{after:?}");
    assert_eq!(stack.close(), 0, "mbuf leak");
}

/// An lcore that only answers pings is working: with the adaptive idle
/// policy it must not nap between them (100 us at a time, on every poll
/// once it has been idle for a while), which held up every reply.
#[test]
fn an_lcore_answering_a_ping_flood_does_not_nap() {
    let eal = eal("0");
    let (us, kernel) = (Ipv4Addr::new(10, 59, 0, 2), Ipv4Addr::new(10, 59, 0, 1));
    let mut cfg = RuntimeConfig::new("net_tap0,iface=ainftap59", us, 24);
    cfg.idle = stack::runtime::IdlePolicy::Adaptive;
    let run = Running::start(&eal, &cfg, |_| Services::new());
    tap_up("ainftap59", kernel, 24);
    let first = sh_out(&format!("ping -c 1 -W 2 {us}"));
    assert!(
        first.contains("1 received"),
        "ARP resolved both ways:\n{first}"
    );
    let naps = || run.counters[0].snapshot().idle_naps;
    let idle_from = naps();
    std::thread::sleep(Duration::from_secs(1));
    let idle = naps() - idle_from;
    // A flood: the next request as soon as a reply comes.
    let busy_from = naps();
    let flood = sh_out(&format!("ping -f -q -w 1 {us}"));
    let busy = naps() - busy_from;
    let report = run.finish();
    eprintln!("{idle} naps in an idle second, {busy} in a second of flood ping:\n{flood}");
    assert!(idle > 1000, "an idle loop naps: {idle} in a second");
    assert!(report.total.icmp_echo_replies > 1000, "{flood}");
    assert!(
        busy * 4 < idle,
        "napped {busy} times in a second of answering pings, {idle} when idle"
    );
}
