//! Real sockets on 127.0.0.1 (and, for backpressure, loopback in a private
//! network namespace with a rate-limiting qdisc when the process may create
//! one). Every receive loop has a deadline.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use stack::io::kernel::{KernelDatagram, KernelUdp, KernelUdpConfig, KernelUdpError};
use stack::io::{Datagram, PacketIo};

const LO: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
const DEADLINE: Duration = Duration::from_secs(5);

fn cfg() -> KernelUdpConfig {
    KernelUdpConfig {
        recv_buffer: Some(4 << 20),
        ..Default::default()
    }
}

fn bind(cfg: KernelUdpConfig) -> KernelUdp {
    KernelUdp::bind(LO, cfg).expect("bind 127.0.0.1:0")
}

/// Byte `i` of datagram `seq`: the first 4 bytes are `seq` (LE), then a hash.
fn pattern(seq: u32, i: usize) -> u8 {
    if i < 4 {
        return seq.to_le_bytes()[i];
    }
    let mut x = seq.wrapping_mul(0x9E37_79B1) ^ (i as u32).wrapping_mul(0x85EB_CA6B);
    x ^= x >> 15;
    x = x.wrapping_mul(0x2C1B_3C6D);
    (x >> 24) as u8
}

fn make(io: &mut KernelUdp, peer: SocketAddrV4, seq: u32, len: usize) -> KernelDatagram {
    let mut d = io.alloc().expect("alloc");
    assert_eq!(d.capacity(), io.max_payload());
    assert_eq!(d.payload().len(), 0);
    assert_eq!(d.local_port(), io.local_addr().port());
    d.set_len(len);
    for (i, b) in d.payload_mut().iter_mut().enumerate() {
        *b = pattern(seq, i);
    }
    d.set_peer(peer);
    d
}

fn expected(seq: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern(seq, i)).collect()
}

/// Send everything, retrying on backpressure, within the deadline.
fn send_all(io: &mut KernelUdp, bufs: &mut Vec<KernelDatagram>) {
    let end = Instant::now() + DEADLINE;
    while !bufs.is_empty() {
        assert!(Instant::now() < end, "send_all: {} left", bufs.len());
        if io.send_burst(bufs) == 0 {
            thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Receive until `n` datagrams arrived or the deadline passed; returns the
/// datagrams and the largest count a single `recv_burst` returned.
fn recv_n(io: &mut KernelUdp, n: usize, max: usize) -> (Vec<KernelDatagram>, usize) {
    let end = Instant::now() + DEADLINE;
    let mut out = Vec::new();
    let mut biggest = 0;
    while out.len() < n && Instant::now() < end {
        let before = out.len();
        let want = max.min(n - out.len());
        let got = io.recv_burst(&mut out, want);
        assert_eq!(out.len() - before, got, "recv_burst return value");
        assert!(got <= max, "recv_burst returned {got} > max {max}");
        biggest = biggest.max(got);
        if got == 0 {
            thread::sleep(Duration::from_micros(200));
        }
    }
    (out, biggest)
}

/// `got` matches `want` (seq, len) positionally: complete, in order, byte-exact.
fn check(
    got: &[KernelDatagram],
    want: &[(u32, usize)],
    from: SocketAddrV4,
    to_port: u16,
    what: &str,
) {
    assert_eq!(got.len(), want.len(), "{what}: datagram count");
    for (i, (d, &(seq, len))) in got.iter().zip(want).enumerate() {
        assert_eq!(d.payload().len(), len, "{what}: #{i} length");
        assert!(
            d.payload() == expected(seq, len).as_slice(),
            "{what}: #{i} (seq {seq}, len {len}) bytes differ"
        );
        assert_eq!(d.peer(), from, "{what}: #{i} peer");
        assert_eq!(d.local_port(), to_port, "{what}: #{i} local_port");
        // Copied out of a GRO aggregate (max_payload) or handed out in
        // its own receive buffer (larger: one spare byte, or 64 KiB).
        assert!(d.capacity() >= 1472, "{what}: #{i} capacity");
    }
}

/// UDP GSO (Linux 4.18) and GRO (5.0) are on by default, and this
/// suite's GSO/GRO checks rely on them: fail here rather than let those
/// checks pass without running.
#[test]
fn gso_and_gro_are_on_over_loopback() {
    let a = bind(cfg());
    assert!(a.gso_enabled(), "UDP GSO is off: kernel older than 4.18?");
    assert!(a.max_gso_segments() > 1);
    assert!(a.gro_enabled(), "UDP GRO is off: kernel older than 5.0?");
}

#[test]
fn every_size_1_to_1472_both_directions() {
    let mut a = bind(cfg());
    let mut b = bind(cfg());
    let aa = a.local_addr();
    assert_eq!(a.max_payload(), 1472);
    assert_eq!(a.local_ip(), Ipv4Addr::LOCALHOST);
    assert_ne!(aa.port(), 0);

    // a -> b ascending (no two equal sizes in a row: one datagram per send);
    // b -> a descending (each shorter one closes a 2-datagram GSO batch).
    let up: Vec<usize> = (1..=1472).collect();
    let down: Vec<usize> = (1..=1472).rev().collect();
    one_way(&mut a, &mut b, &up, "a->b");
    one_way(&mut b, &mut a, &down, "b->a");
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.tx_datagrams, 1472);
    assert_eq!(sb.rx_datagrams, 1472);
    assert_eq!(sb.tx_datagrams, 1472);
    assert_eq!(sa.rx_datagrams, 1472);
    assert_eq!(sa.rx_bytes, 1472 * 1473 / 2);
    assert_eq!(sb.tx_bytes, 1472 * 1473 / 2);
    assert_eq!(
        sa.tx_dropped + sb.tx_dropped + sa.rx_errors + sb.rx_errors,
        0
    );
    if b.gso_enabled() {
        assert!(
            sb.gso_batches > 0,
            "descending sizes should pair up: {sb:?}"
        );
        assert!(sb.tx_calls < 1472);
    }
}

fn one_way(tx: &mut KernelUdp, rx: &mut KernelUdp, sizes: &[usize], name: &str) {
    let (from, to) = (tx.local_addr(), rx.local_addr());
    for (c, chunk) in sizes.chunks(128).enumerate() {
        let want: Vec<(u32, usize)> = chunk
            .iter()
            .map(|&len| ((c * 128) as u32 + len as u32, len))
            .collect();
        let mut bufs: Vec<_> = want.iter().map(|&(s, l)| make(tx, to, s, l)).collect();
        send_all(tx, &mut bufs);
        let (got, _) = recv_n(rx, want.len(), 64);
        check(&got, &want, from, to.port(), name);
    }
}

fn gso_burst(rx_gro: bool) {
    let mut a = bind(cfg());
    let mut b = bind(KernelUdpConfig {
        gro: rx_gro,
        ..cfg()
    });
    assert!(rx_gro || !b.gro_enabled());
    let to = b.local_addr();
    let len = 1200;
    let want: Vec<(u32, usize)> = (0..1000).map(|s| (s, len)).collect();
    let mut bufs: Vec<_> = want.iter().map(|&(s, l)| make(&mut a, to, s, l)).collect();

    // One burst of 1000 needs the receiver to hold all of it before it reads.
    let rcvbuf = b.recv_buffer_size().unwrap();
    let chunk = if rcvbuf >= 4 << 20 { 1000 } else { 64 };
    if chunk < 1000 {
        eprintln!("SO_RCVBUF is only {rcvbuf} (net.core.rmem_max): sending in chunks of {chunk}");
    }
    let mut got = Vec::new();
    let mut biggest = 0;
    while !bufs.is_empty() {
        let rest = bufs.split_off(chunk.min(bufs.len()));
        let n = bufs.len();
        let sent = a.send_burst(&mut bufs);
        assert_eq!(sent, n, "loopback takes a whole burst");
        assert!(bufs.is_empty());
        bufs = rest;
        let (mut g, big) = recv_n(&mut b, n, 4096);
        biggest = biggest.max(big);
        got.append(&mut g);
    }
    check(&got, &want, a.local_addr(), to.port(), "gso burst");
    eprintln!(
        "gso burst: gso={} gro={} tx {:?}, largest recv_burst {biggest}",
        a.gso_enabled(),
        b.gro_enabled(),
        a.stats()
    );
    let s = a.stats();
    assert_eq!(s.tx_datagrams, 1000);
    if a.gso_enabled() {
        let per = a.max_gso_segments().min(65507 / len);
        assert!(s.gso_batches > 0, "{s:?}");
        assert!(
            s.tx_calls as usize <= 1000_usize.div_ceil(per) + 1000 / chunk,
            "{s:?}"
        );
        // GRO keeps a GSO send in one receive buffer on loopback: one
        // recvmmsg call returns more datagrams than it has buffers.
        if b.gro_enabled() {
            assert!(
                biggest > 32,
                "GRO split should exceed one per buffer, got {biggest}"
            );
        } else {
            assert!(biggest <= 32);
        }
    }
    let r = b.stats();
    assert_eq!(
        (r.rx_datagrams, r.rx_bytes, r.rx_errors),
        (1000, 1_200_000, 0)
    );
}

#[test]
fn gso_burst_of_1000_arrives_complete_in_order_with_gro() {
    gso_burst(true);
}

#[test]
fn gso_burst_of_1000_arrives_complete_in_order_without_gro() {
    gso_burst(false);
}

#[test]
fn recv_burst_honours_max_and_keeps_the_rest() {
    let mut a = bind(cfg());
    let mut b = bind(cfg());
    let to = b.local_addr();
    let want: Vec<(u32, usize)> = (0..300).map(|s| (s, 1000)).collect();
    let mut bufs: Vec<_> = want.iter().map(|&(s, l)| make(&mut a, to, s, l)).collect();
    send_all(&mut a, &mut bufs);
    let (got, biggest) = recv_n(&mut b, 300, 7);
    assert!(biggest <= 7);
    check(&got, &want, a.local_addr(), to.port(), "max 7");
    let mut none = Vec::new();
    assert_eq!(b.recv_burst(&mut none, 0), 0);
    assert_eq!(
        b.recv_burst(&mut none, 100),
        0,
        "nothing left: WouldBlock -> 0"
    );
}

#[test]
fn mixed_sizes_two_peers_one_burst() {
    let mut a = bind(cfg());
    let mut b = bind(cfg());
    let mut c = bind(cfg());
    let (pb, pc) = (b.local_addr(), c.local_addr());
    // (peer, seq, len): runs of equal sizes, a shorter tail, a zero-length
    // datagram, peers interleaved.
    let plan: Vec<(SocketAddrV4, u32, usize)> = [
        (pb, 500),
        (pb, 500),
        (pb, 500),
        (pb, 300),
        (pb, 300),
        (pc, 300),
        (pc, 300),
        (pc, 1),
        (pb, 0),
        (pb, 1472),
        (pb, 1472),
        (pc, 1472),
        (pc, 1472),
        (pc, 1472),
        (pb, 7),
        (pc, 0),
        (pc, 9),
        (pc, 9),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(p, l))| (p, i as u32, l))
    .collect();
    let mut bufs: Vec<_> = plan
        .iter()
        .map(|&(p, s, l)| make(&mut a, p, s, l))
        .collect();
    assert_eq!(a.send_burst(&mut bufs), plan.len());
    assert!(bufs.is_empty());
    let for_peer = |p| -> Vec<(u32, usize)> {
        plan.iter()
            .filter(|x| x.0 == p)
            .map(|x| (x.1, x.2))
            .collect()
    };
    let (wb, wc) = (for_peer(pb), for_peer(pc));
    let (gb, _) = recv_n(&mut b, wb.len(), 64);
    let (gc, _) = recv_n(&mut c, wc.len(), 64);
    check(&gb, &wb, a.local_addr(), pb.port(), "peer b");
    check(&gc, &wc, a.local_addr(), pc.port(), "peer c");
    let s = a.stats();
    assert_eq!(s.tx_datagrams as usize, plan.len());
    assert_eq!(s.tx_dropped, 0);
    if a.gso_enabled() {
        // GSO runs: [500,500,500,300] [300,300,1] [1472x2] [1472x3] [9x2]
        // (14 datagrams); alone: B300 (peer changes next), B0, B7, C0.
        // One sendmmsg per stretch of one segment size, which a lone
        // datagram joins when it is not longer (and not empty):
        // {[500..] B300} {[300..]} {B0} {[1472x2] [1472x3] B7} {C0} {[9x2]}.
        assert_eq!(s.gso_batches, 5, "{s:?}");
        assert_eq!(s.tx_calls, 6, "{s:?}");
    } else {
        assert_eq!(s.tx_calls, 1, "one sendmmsg for the burst: {s:?}");
    }
}

/// A burst to many peers leaves in one system call: each peer's run is
/// one GSO message, a lone datagram no longer than the segment size rides
/// along, and all of them go in one `sendmmsg`.
#[test]
fn a_burst_to_many_peers_is_one_sendmmsg() {
    let mut a = bind(cfg());
    let mut peers: Vec<KernelUdp> = (0..6).map(|_| bind(cfg())).collect();
    let addrs: Vec<SocketAddrV4> = peers.iter().map(|p| p.local_addr()).collect();
    let mut plan = Vec::new();
    for (k, &to) in addrs.iter().enumerate() {
        let base = 10 * k as u32;
        plan.extend([(to, base, 1000), (to, base + 1, 1000), (to, base + 2, 1000)]);
        if k % 2 == 0 {
            plan.push((addrs[(k + 1) % addrs.len()], base + 3, 999));
        }
    }
    let mut bufs: Vec<_> = plan
        .iter()
        .map(|&(p, s, l)| make(&mut a, p, s, l))
        .collect();
    assert_eq!(a.send_burst(&mut bufs), plan.len());
    for (k, peer) in peers.iter_mut().enumerate() {
        let want: Vec<(u32, usize)> = plan
            .iter()
            .filter(|x| x.0 == addrs[k])
            .map(|x| (x.1, x.2))
            .collect();
        let (got, _) = recv_n(peer, want.len(), 64);
        check(&got, &want, a.local_addr(), addrs[k].port(), "peer");
    }
    let s = a.stats();
    assert_eq!(s.tx_datagrams as usize, plan.len());
    assert_eq!(s.tx_calls, 1, "{s:?}");
    assert_eq!(s.gso_batches, 6, "{s:?}");
}

#[test]
fn interop_with_plain_std_socket_both_directions() {
    let mut k = bind(cfg());
    let std_sock = UdpSocket::bind(LO).unwrap();
    std_sock
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let sa = match std_sock.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };

    // std -> kernel backend: plain sendto, including equal sizes in a row.
    let sizes = [1usize, 2, 100, 100, 100, 1472, 0, 777];
    let want: Vec<(u32, usize)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    for &(s, l) in &want {
        std_sock
            .send_to(&expected(s, l), k.local_addr())
            .expect("std send_to");
    }
    let (got, _) = recv_n(&mut k, want.len(), 32);
    check(&got, &want, sa, k.local_addr().port(), "std->kernel");

    // kernel backend -> std: a GSO-sized run with a shorter tail must arrive
    // as separate datagrams (segmented by the kernel, std has no UDP_GRO).
    let want: Vec<(u32, usize)> = (0..50)
        .map(|s| (100 + s, if s == 49 { 333 } else { 1000 }))
        .chain([(200, 1472), (201, 5)])
        .collect();
    let mut bufs: Vec<_> = want.iter().map(|&(s, l)| make(&mut k, sa, s, l)).collect();
    send_all(&mut k, &mut bufs);
    let mut buf = [0u8; 65536];
    for (i, &(s, l)) in want.iter().enumerate() {
        let (n, from) = std_sock.recv_from(&mut buf).expect("std recv_from");
        assert_eq!(from, std::net::SocketAddr::V4(k.local_addr()));
        assert_eq!(n, l, "kernel->std #{i} length");
        assert_eq!(&buf[..n], expected(s, l).as_slice(), "kernel->std #{i}");
    }
    if k.gso_enabled() {
        assert!(k.stats().gso_batches >= 1);
    }
}

#[test]
fn wrong_source_port_is_dropped_and_counted() {
    let mut a = bind(cfg());
    let mut b = bind(cfg());
    let to = b.local_addr();
    let mut bad = make(&mut a, to, 1, 10);
    bad.set_local_port(a.local_addr().port().wrapping_add(1));
    let mut bufs = vec![
        make(&mut a, to, 0, 10),
        bad,
        make(&mut a, to, 2, 10),
        make(&mut a, to, 3, 10),
    ];
    assert_eq!(a.send_burst(&mut bufs), 4);
    let s = a.stats();
    assert_eq!(
        (s.wrong_source_port, s.tx_dropped, s.tx_datagrams),
        (1, 1, 3)
    );
    let (got, _) = recv_n(&mut b, 3, 32);
    check(
        &got,
        &[(0, 10), (2, 10), (3, 10)],
        a.local_addr(),
        to.port(),
        "around bad port",
    );
}

/// Datagrams to port 0 (a peer whose datagrams came from it) are dropped
/// and counted. The kernel refuses to send them (EINVAL), which a GSO run
/// of them made look like a route that cannot segment: GSO went off for
/// good, for every peer.
#[test]
fn datagrams_to_port_0_are_dropped_and_gso_stays_on() {
    let mut a = bind(cfg());
    let mut b = bind(cfg());
    assert!(a.gso_enabled());
    let to = b.local_addr();
    let nowhere = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
    let mut bufs = vec![
        make(&mut a, nowhere, 0, 100),
        make(&mut a, nowhere, 1, 100),
        make(&mut a, to, 2, 100),
        make(&mut a, to, 3, 100),
        make(&mut a, to, 4, 100),
        make(&mut a, nowhere, 5, 100),
        make(&mut a, to, 6, 100),
    ];
    assert_eq!(a.send_burst(&mut bufs), 7);
    assert!(a.gso_enabled(), "GSO turned off");
    let s = a.stats();
    assert_eq!((s.tx_dropped, s.tx_datagrams), (3, 4), "{s:?}");
    let (got, _) = recv_n(&mut b, 4, 32);
    check(
        &got,
        &[(2, 100), (3, 100), (4, 100), (6, 100)],
        a.local_addr(),
        to.port(),
        "around port 0",
    );
}

#[test]
fn a_datagram_alone_in_its_receive_buffer_is_handed_out_without_a_copy() {
    let plain = UdpSocket::bind(LO).unwrap();
    let mut b = bind(cfg());
    let to = b.local_addr();
    let from = match plain.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    // Sent one by one, each datagram arrives in a receive buffer of its
    // own: the buffer itself is handed out (longer than max_payload), and
    // one given back comes round again instead of a fresh allocation.
    let mut first: Option<*const u8> = None;
    let mut seen_again = false;
    for seq in 0..8u32 {
        plain.send_to(&expected(seq, 1000), to).unwrap();
        let (mut got, _) = recv_n(&mut b, 1, 1);
        check(&got, &[(seq, 1000)], from, to.port(), "alone");
        let d = got.pop().unwrap();
        assert!(d.capacity() > b.max_payload(), "copied: {d:?}");
        let ptr = d.payload().as_ptr();
        seen_again |= first == Some(ptr);
        first.get_or_insert(ptr);
        b.recycle(d);
    }
    assert!(seen_again, "a given-back receive buffer was never reused");

    // A GSO send arrives as one GRO aggregate: its datagrams are copied
    // out into buffers of max_payload.
    let mut a = bind(cfg());
    let want: Vec<(u32, usize)> = (0..4).map(|s| (s, 1200)).collect();
    let mut bufs: Vec<_> = want.iter().map(|&(s, l)| make(&mut a, to, s, l)).collect();
    send_all(&mut a, &mut bufs);
    let (got, _) = recv_n(&mut b, 4, 64);
    check(&got, &want, a.local_addr(), to.port(), "aggregate");
    assert!(got.iter().all(|d| d.capacity() == b.max_payload()));
}

#[test]
fn alloc_reuses_sent_buffers() {
    let mut a = bind(cfg());
    let b = bind(cfg());
    let mut bufs = vec![make(&mut a, b.local_addr(), 0, 1472)];
    send_all(&mut a, &mut bufs);
    let d = a.alloc().unwrap();
    assert_eq!((d.payload().len(), d.capacity()), (0, 1472));
    a.poll(Instant::now());
}

#[test]
#[should_panic(expected = "beyond capacity")]
fn set_len_beyond_capacity_panics() {
    let mut a = bind(cfg());
    let mut d = a.alloc().unwrap();
    d.set_len(1473);
}

#[test]
fn unspecified_bind_reports_unspecified_local_ip() {
    let k = KernelUdp::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0), cfg()).unwrap();
    assert_eq!(k.local_ip(), Ipv4Addr::UNSPECIFIED);
    assert_ne!(k.local_addr().port(), 0);
}

#[test]
fn bind_errors_name_the_fix() {
    let a = bind(cfg());
    let err = KernelUdp::bind(a.local_addr(), cfg()).unwrap_err();
    assert!(matches!(err, KernelUdpError::AddrInUse { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("already in use"), "{msg}");
    assert!(msg.contains("port 0"), "{msg}");
    assert!(msg.contains(&a.local_addr().to_string()), "{msg}");

    // Also in use by a plain std socket.
    let s = UdpSocket::bind(LO).unwrap();
    let sa = match s.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    assert!(matches!(
        KernelUdp::bind(sa, cfg()),
        Err(KernelUdpError::AddrInUse { .. })
    ));

    // Not an address of this host (TEST-NET-3; binding sends nothing).
    let err =
        KernelUdp::bind(SocketAddrV4::new(Ipv4Addr::new(203, 0, 113, 7), 0), cfg()).unwrap_err();
    assert!(
        matches!(err, KernelUdpError::AddrNotAvailable { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("0.0.0.0"), "{err}");

    for bad in [
        KernelUdpConfig {
            max_payload: 0,
            ..cfg()
        },
        KernelUdpConfig {
            max_payload: 65_508,
            ..cfg()
        },
        KernelUdpConfig { batch: 0, ..cfg() },
    ] {
        let err = KernelUdp::bind(LO, bad).unwrap_err();
        assert!(matches!(err, KernelUdpError::Config(_)), "{err:?}");
    }
}

/// Loopback frees a datagram's send-buffer charge as soon as it is handed to
/// the receiver (`loopback_xmit` orphans the skb), so even a tiny SO_SNDBUF
/// never fills: the kernel takes the whole flood and the receiver's full
/// SO_RCVBUF drops the surplus. This pins that behaviour down honestly.
#[test]
fn backpressure_on_plain_loopback_never_blocks_receiver_drops() {
    for gso in [false, true] {
        let mut a = bind(KernelUdpConfig {
            send_buffer: Some(1),
            gso,
            ..cfg()
        });
        assert!(a.send_buffer_size().unwrap() <= 8192, "tiny SO_SNDBUF");
        let mut b = bind(KernelUdpConfig {
            recv_buffer: Some(1),
            gro: false,
            ..cfg()
        });
        let to = b.local_addr();
        let n = 5000;
        let mut bufs: Vec<_> = (0..n).map(|s| make(&mut a, to, s, 1472)).collect();
        let sent = a.send_burst(&mut bufs);
        assert_eq!(sent, n as usize, "gso={gso}: loopback never pushes back");
        assert!(bufs.is_empty());
        assert_eq!(a.stats().tx_dropped, 0);
        // Drain until 100 ms pass with nothing new (everything is already
        // queued or dropped on loopback).
        let mut got = Vec::new();
        let mut quiet = Instant::now();
        while quiet.elapsed() < Duration::from_millis(100) {
            if b.recv_burst(&mut got, 64) > 0 {
                quiet = Instant::now();
            } else {
                thread::sleep(Duration::from_millis(1));
            }
        }
        assert!(
            got.len() < n as usize / 2,
            "gso={gso}: receiver with a tiny SO_RCVBUF drops most, kept {}",
            got.len()
        );
        // What did arrive is intact and in order (a subsequence).
        let mut last = None;
        for d in &got {
            let p = d.payload();
            let seq = u32::from_le_bytes(p[..4].try_into().unwrap());
            assert!(p == expected(seq, 1472).as_slice(), "intact");
            assert!(last < Some(seq), "in order");
            last = Some(seq);
        }
    }
}

/// Real backpressure: in a private network namespace, a token-bucket qdisc
/// on `lo` holds datagrams (still charged to the sender's tiny SO_SNDBUF), so
/// sendmsg returns EAGAIN. Needs CAP_SYS_ADMIN/CAP_NET_ADMIN, `ip` and `tc`;
/// otherwise it says why and checks nothing.
#[test]
fn backpressure_with_qdisc_in_private_netns_keeps_rest_in_order() {
    let outcome = thread::spawn(|| -> Result<(), String> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("unshare(CLONE_NEWNET): {e}"))?;
        for args in [
            &["ip", "link", "set", "lo", "up"][..],
            &[
                "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "2mbit", "burst",
                "32kbit", "latency", "500ms",
            ][..],
        ] {
            let st = Command::new(args[0])
                .args(&args[1..])
                .status()
                .map_err(|e| format!("{}: {e}", args[0]))?;
            if !st.success() {
                return Err(format!("{args:?}: {st}"));
            }
        }
        for gso in [false, true] {
            backpressure_case(gso);
        }
        Ok(())
    })
    .join()
    .expect("backpressure thread panicked");
    if let Err(why) = outcome {
        panic!("backpressure test needs root, ip and tc (iproute2) with the tbf qdisc: {why}");
    }
}

fn backpressure_case(gso: bool) {
    let mut a = bind(KernelUdpConfig {
        send_buffer: Some(1),
        gso,
        ..cfg()
    });
    let mut b = bind(cfg());
    let to = b.local_addr();
    let n = 80u32;
    let mut bufs: Vec<_> = (0..n).map(|s| make(&mut a, to, s, 1000)).collect();
    let sent = a.send_burst(&mut bufs);
    assert!(
        sent > 0 && sent < n as usize,
        "gso={gso}: expected partial send, sent {sent}"
    );
    eprintln!("backpressure gso={gso}: first send_burst took {sent} of {n}");
    assert_eq!(bufs.len(), n as usize - sent);
    for (i, d) in bufs.iter().enumerate() {
        let seq = sent as u32 + i as u32;
        assert!(
            d.payload() == expected(seq, 1000).as_slice(),
            "gso={gso}: leftover #{i} should be seq {seq}"
        );
    }
    assert_eq!(a.stats().tx_dropped, 0, "backpressure drops nothing");
    // Keep draining both ends until everything is through: nothing is lost.
    let end = Instant::now() + DEADLINE;
    let mut got = Vec::new();
    while got.len() < n as usize && Instant::now() < end {
        a.send_burst(&mut bufs);
        if b.recv_burst(&mut got, 64) == 0 {
            thread::sleep(Duration::from_millis(1));
        }
    }
    let want: Vec<(u32, usize)> = (0..n).map(|s| (s, 1000)).collect();
    check(&got, &want, a.local_addr(), to.port(), "after backpressure");
    assert_eq!(a.stats().tx_datagrams, n as u64);
}

#[test]
fn route_mtu_follows_the_interface_towards_the_peer() {
    use stack::io::kernel::{route_mtu, route_payload};
    let lo_mtu: usize = std::fs::read_to_string("/sys/class/net/lo/mtu")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let local = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9);
    // An IPv4 packet is at most 65535 bytes, whatever the device allows.
    assert_eq!(route_mtu(local).unwrap(), lo_mtu.min(65535));
    assert_eq!(
        route_payload(local, 32768).unwrap(),
        (lo_mtu - 28).min(32768)
    );
    assert_eq!(route_payload(local, 1200).unwrap(), 1200);

    // A veth with a 1500-byte MTU: its subnet is reached through it, so
    // the payload is 1472, whatever the cap above it.
    let sh = |cmd: &str| {
        let st = Command::new("sh").args(["-c", cmd]).status().unwrap();
        assert!(st.success(), "{cmd}");
    };
    sh("ip link del ainfmtu0 2>/dev/null; \
        ip link add ainfmtu0 type veth peer name ainfmtu1 && ip link set ainfmtu1 up && \
        ip link set ainfmtu0 mtu 1500 up && ip addr add 10.73.0.1/24 dev ainfmtu0");
    let beyond = SocketAddrV4::new(Ipv4Addr::new(10, 73, 0, 2), 9);
    let payload = route_payload(beyond, 32768);
    sh("ip link set ainfmtu0 mtu 9000");
    let jumbo = route_payload(beyond, 32768);
    sh("ip link del ainfmtu0");
    assert_eq!(payload.unwrap(), 1472);
    assert_eq!(jumbo.unwrap(), 8972);
}

#[test]
fn released_datagrams_are_reused_by_alloc_with_a_clean_header() {
    let mut a = bind(cfg());
    let mut b = bind(cfg());
    let to = b.local_addr();
    // Two in one GSO send arrive as one aggregate and are copied out into
    // buffers of max_payload, the kind alloc hands out (a datagram alone
    // keeps its receive buffer, which goes back to the receive side).
    let mut bufs = vec![make(&mut a, to, 0, 900), make(&mut a, to, 1, 900)];
    send_all(&mut a, &mut bufs);
    let (mut got, _) = recv_n(&mut b, 2, 8);
    let d = got.pop().expect("two datagrams");
    assert_eq!(d.payload(), &expected(1, 900)[..]);
    let addr = d.payload().as_ptr();
    b.release(d);
    // The buffer comes back, as a fresh datagram: empty, our port, no peer.
    let again = b.alloc().expect("alloc");
    assert_eq!(
        again.payload().as_ptr(),
        addr,
        "the released buffer is reused"
    );
    assert_eq!(again.payload().len(), 0);
    assert_eq!(again.capacity(), b.max_payload());
    assert_eq!(again.local_port(), to.port());
    assert_eq!(again.peer(), SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
}

#[test]
fn a_closed_peer_port_is_reported_and_sends_to_others_still_go_out() {
    let mut io = bind(cfg());
    let mut live = bind(cfg());
    let closed = {
        let gone = bind(cfg());
        gone.local_addr()
    }; // its socket is closed here: nobody listens at `closed` now
    let mut bufs = vec![make(&mut io, closed, 0, 100)];
    send_all(&mut io, &mut bufs);
    // The ICMP port unreachable comes back at once on loopback; the next
    // sends, to a live peer, must not be eaten by the pending error.
    let end = Instant::now() + DEADLINE;
    let mut found = Vec::new();
    while found.is_empty() && Instant::now() < end {
        io.poll(Instant::now());
        found = io.take_closed_ports();
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(found, vec![closed]);
    assert_eq!(io.stats().port_unreachable, 1);
    assert!(io.take_closed_ports().is_empty(), "taken once");

    let mut bufs = vec![make(&mut io, closed, 1, 100)];
    send_all(&mut io, &mut bufs);
    thread::sleep(Duration::from_millis(20)); // the second ICMP error is pending
    let mut bufs: Vec<_> = (2..12)
        .map(|s| make(&mut io, live.local_addr(), s, 200))
        .collect();
    send_all(&mut io, &mut bufs);
    let (got, _) = recv_n(&mut live, 10, 32);
    let want: Vec<(u32, usize)> = (2..12).map(|s| (s, 200)).collect();
    let to_port = live.local_addr().port();
    check(&got, &want, io.local_addr(), to_port, "after a closed port");
    assert_eq!(io.stats().tx_dropped, 0);
    io.poll(Instant::now());
    assert_eq!(io.take_closed_ports(), vec![closed]);
}

/// Under receive load the socket's error queue has no room for an ICMP
/// error (it counts against the receive buffer), but the kernel still
/// fails the next send with it. That send goes again rather than being
/// dropped, as when the error queue kept the error.
#[test]
fn a_send_failed_for_an_earlier_icmp_error_goes_again_when_the_error_queue_kept_nothing() {
    let mut io = bind(KernelUdpConfig {
        recv_buffer: Some(4096),
        ..Default::default()
    });
    let mut live = bind(cfg());
    let closed = bind(cfg()).local_addr(); // nobody listens there now
                                           // Fill io's receive buffer (8 KiB), the last bytes with small
                                           // datagrams, so that no room is left for the ICMP error; nothing
                                           // reads it.
    let flood = UdpSocket::bind(LO).unwrap();
    for len in [1000, 1] {
        for _ in 0..64 {
            flood.send_to(&vec![0u8; len], io.local_addr()).unwrap();
        }
    }
    // The ICMP error comes back at once on loopback, but a busy host may
    // be late with it: a round whose send found none pending proves
    // nothing, and goes again.
    let mut seq = 1;
    for round in 0.. {
        let mut bufs = vec![make(&mut io, closed, 0, 100)];
        send_all(&mut io, &mut bufs);
        thread::sleep(Duration::from_millis(20)); // its ICMP error is in
        let mut bufs: Vec<_> = (seq..seq + 10)
            .map(|s| make(&mut io, live.local_addr(), s, 200))
            .collect();
        send_all(&mut io, &mut bufs);
        let (got, _) = recv_n(&mut live, 10, 32);
        let want: Vec<(u32, usize)> = (seq..seq + 10).map(|s| (s, 200)).collect();
        let to_port = live.local_addr().port();
        check(
            &got,
            &want,
            io.local_addr(),
            to_port,
            "after an unqueued ICMP error",
        );
        seq += 10;
        if io.stats().icmp_retries > 0 {
            break;
        }
        assert!(
            round < 20,
            "no send met the pending ICMP error in 20 rounds"
        );
    }
    assert_eq!(io.stats().tx_dropped, 0);
    assert_eq!(
        io.stats().port_unreachable,
        0,
        "the error queue kept nothing (else this is the test above)"
    );
}

/// A datagram the device drops at once is counted as dropped, and the
/// datagrams behind it go out. Here the device is a veth whose far end is
/// too narrow for a 1472-byte datagram: the kernel drops it in the send
/// call and, since the socket asks for errors (IP_RECVERR), says ENOBUFS.
/// It would be dropped on every retry, so waiting for it to go (as for a
/// full socket buffer) would hold up every later datagram, to any peer,
/// for good.
#[test]
fn a_datagram_the_device_drops_does_not_hold_up_the_ones_behind_it() {
    thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        // 10.1.0.2 is the veth's far end, 1280 bytes wide; no address
        // answers there, so its neighbour entry is written by hand.
        let script = "set -e
            ip link set lo up
            ip link add ainfnb0 type veth peer name ainfnb1 address 02:00:00:00:00:02
            ip link set ainfnb1 mtu 1280 up
            ip addr add 10.1.0.1/24 dev ainfnb0
            ip link set ainfnb0 up
            ip neigh add 10.1.0.2 lladdr 02:00:00:00:00:02 dev ainfnb0 nud permanent";
        let out = Command::new("sh").arg("-c").arg(script).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let local = SocketAddrV4::new(Ipv4Addr::new(10, 1, 0, 1), 0);
        let mut a = KernelUdp::bind(local, cfg()).unwrap();
        let mut b = KernelUdp::bind(local, cfg()).unwrap();
        let narrow = SocketAddrV4::new(Ipv4Addr::new(10, 1, 0, 2), 9);
        let mut bufs = vec![
            make(&mut a, narrow, 0, 1472),
            make(&mut a, b.local_addr(), 1, 100),
        ];
        let end = Instant::now() + DEADLINE;
        while !bufs.is_empty() {
            assert!(
                Instant::now() < end,
                "{} datagrams still waiting: {:?}",
                bufs.len(),
                a.stats()
            );
            a.send_burst(&mut bufs);
        }
        assert_eq!(a.stats().tx_dropped, 1, "{:?}", a.stats());
        let mut got = Vec::new();
        while got.is_empty() {
            assert!(Instant::now() < end, "nothing arrived");
            b.recv_burst(&mut got, 8);
        }
        check(
            &got,
            &[(1, 100)],
            a.local_addr(),
            b.local_addr().port(),
            "behind the drop",
        );
    })
    .join()
    .unwrap();
}
