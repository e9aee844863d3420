//! Integration tests of the in-process network and the impairment layer,
//! all on a virtual clock (explicit `Instant`s, no sleeping).

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use stack::io::impair::{ImpairConfig, Impaired};
use stack::io::memory::{MemDatagram, MemEndpoint, MemNet, MemNetConfig};
use stack::io::{Datagram, PacketIo};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const A_PORT: u16 = 4000;
const B_PORT: u16 = 5000;

/// Payload of datagram `i`: its index, then bytes derived from it, with a
/// length that varies with `i`.
fn payload(i: u32) -> Vec<u8> {
    let len = 4 + (i as usize * 7) % 200;
    let mut v = i.to_be_bytes().to_vec();
    v.extend((4..len).map(|k| (i as usize * 31 + k) as u8));
    v
}

fn index(d: &MemDatagram) -> u32 {
    u32::from_be_bytes(d.payload()[..4].try_into().unwrap())
}

fn fill<P: PacketIo>(io: &mut P, i: u32, to: SocketAddrV4) -> P::Buf {
    let mut b = io.alloc().expect("alloc");
    let p = payload(i);
    b.set_len(p.len());
    b.payload_mut().copy_from_slice(&p);
    b.set_peer(to);
    b.set_local_port(A_PORT);
    b
}

fn pair(net: &MemNet, impair: ImpairConfig) -> (MemEndpoint, MemEndpoint) {
    (
        net.endpoint(A, impair).unwrap(),
        net.endpoint(B, ImpairConfig::default()).unwrap(),
    )
}

/// Send `n` datagrams from `a` to `b` in bursts of 64 at time `t`, draining
/// `b` as it goes; then poll `a` at `t + 1s` to release everything held.
fn blast(a: &mut MemEndpoint, b: &mut MemEndpoint, n: u32, t: Instant) -> Vec<MemDatagram> {
    let to = SocketAddrV4::new(b.local_ip(), B_PORT);
    a.poll(t);
    let mut got = Vec::new();
    let mut burst = Vec::new();
    for start in (0..n).step_by(64) {
        for i in start..(start + 64).min(n) {
            burst.push(fill(a, i, to));
        }
        a.send_burst(&mut burst);
        assert!(burst.is_empty());
        while b.recv_burst(&mut got, 256) > 0 {}
    }
    a.poll(t + Duration::from_secs(1));
    while b.recv_burst(&mut got, 256) > 0 {}
    got
}

#[test]
fn perfect_link_is_exact_and_in_order_with_address_rewrite() {
    let net = MemNet::new();
    let (mut a, mut b) = pair(&net, ImpairConfig::default());
    let t = Instant::now();
    let got = blast(&mut a, &mut b, 10_000, t);
    assert_eq!(got.len(), 10_000);
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d.payload(), payload(i as u32).as_slice(), "datagram {i}");
        assert_eq!(d.peer(), SocketAddrV4::new(A, A_PORT));
        assert_eq!(d.local_port(), B_PORT);
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(
        (sa.sent, sa.impair.delivered, sa.no_route, sa.pending),
        (10_000, 10_000, 0, 0)
    );
    assert_eq!((sb.received, sb.rx_queued, sb.rx_overflow), (10_000, 0, 0));
}

#[test]
fn reply_goes_back_to_sender_port() {
    let net = MemNet::new();
    let (mut a, mut b) = pair(&net, ImpairConfig::default());
    let mut v = vec![fill(&mut a, 1, SocketAddrV4::new(B, B_PORT))];
    a.send_burst(&mut v);
    let mut got = Vec::new();
    assert_eq!(b.recv_burst(&mut got, 8), 1);
    // Echo: swap nothing, the received datagram already names the sender.
    b.send_burst(&mut got);
    let mut back = Vec::new();
    assert_eq!(a.recv_burst(&mut back, 8), 1);
    assert_eq!(back[0].peer(), SocketAddrV4::new(B, B_PORT));
    assert_eq!(back[0].local_port(), A_PORT);
    assert_eq!(back[0].payload(), payload(1).as_slice());
}

#[test]
fn recv_burst_respects_max() {
    let net = MemNet::new();
    let (mut a, mut b) = pair(&net, ImpairConfig::default());
    let mut v: Vec<_> = (0..10)
        .map(|i| fill(&mut a, i, SocketAddrV4::new(B, B_PORT)))
        .collect();
    assert_eq!(a.send_burst(&mut v), 10);
    let mut got = Vec::new();
    assert_eq!(b.recv_burst(&mut got, 3), 3);
    assert_eq!(b.recv_burst(&mut got, 100), 7);
    assert_eq!(b.recv_burst(&mut got, 100), 0);
    assert_eq!(
        got.iter().map(index).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
}

#[test]
fn loss_ten_percent() {
    let net = MemNet::new();
    let cfg = ImpairConfig {
        loss: 0.1,
        seed: 5,
        ..Default::default()
    };
    let (mut a, mut b) = pair(&net, cfg);
    let got = blast(&mut a, &mut b, 100_000, Instant::now());
    let lost = 100_000 - got.len() as u64;
    assert!((9_000..=11_000).contains(&lost), "lost {lost}");
    assert_eq!(a.stats().impair.dropped, lost);
    // What arrives is intact and in order.
    assert!(got.windows(2).all(|w| index(&w[0]) < index(&w[1])));
    assert!(got
        .iter()
        .all(|d| d.payload() == payload(index(d)).as_slice()));
}

#[test]
fn duplication() {
    let net = MemNet::new();
    let cfg = ImpairConfig {
        duplicate: 0.05,
        seed: 6,
        ..Default::default()
    };
    let (mut a, mut b) = pair(&net, cfg);
    let got = blast(&mut a, &mut b, 20_000, Instant::now());
    let dups = got.len() as u64 - 20_000;
    assert!((800..=1_200).contains(&dups), "dups {dups}");
    assert_eq!(a.stats().impair.duplicated, dups);
    let distinct: HashSet<u32> = got.iter().map(index).collect();
    assert_eq!(distinct.len(), 20_000);
    assert!(got
        .iter()
        .all(|d| d.payload() == payload(index(d)).as_slice()));
}

#[test]
fn reordering_changes_order_loses_nothing() {
    let net = MemNet::new();
    let cfg = ImpairConfig {
        reorder: 0.1,
        seed: 8,
        ..Default::default()
    };
    let (mut a, mut b) = pair(&net, cfg);
    let got = blast(&mut a, &mut b, 20_000, Instant::now());
    let mut idx: Vec<u32> = got.iter().map(index).collect();
    let out_of_order = idx.windows(2).filter(|w| w[0] > w[1]).count();
    let reordered = a.stats().impair.reordered;
    assert!(
        (1_600..=2_400).contains(&reordered),
        "reordered {reordered}"
    );
    assert!(
        out_of_order as u64 >= reordered * 9 / 10,
        "{out_of_order} inversions for {reordered} held"
    );
    // Reordering is local: a held packet is overtaken by a few others only.
    for (pos, &i) in idx.iter().enumerate() {
        assert!(pos as i64 - i as i64 <= 10, "datagram {i} arrived at {pos}");
    }
    idx.sort_unstable();
    assert_eq!(idx, (0..20_000).collect::<Vec<_>>());
}

#[test]
fn corruption_flips_exactly_one_bit() {
    let net = MemNet::new();
    let cfg = ImpairConfig {
        corrupt: 0.02,
        seed: 9,
        ..Default::default()
    };
    let (mut a, mut b) = pair(&net, cfg);
    let got = blast(&mut a, &mut b, 20_000, Instant::now());
    assert_eq!(got.len(), 20_000);
    let mut corrupted = 0u64;
    for (i, d) in got.iter().enumerate() {
        let want = payload(i as u32);
        assert_eq!(d.payload().len(), want.len());
        let bits: u32 = d
            .payload()
            .iter()
            .zip(&want)
            .map(|(x, y)| (x ^ y).count_ones())
            .sum();
        assert!(bits <= 1, "datagram {i}: {bits} bits differ");
        corrupted += u64::from(bits);
    }
    assert_eq!(a.stats().impair.corrupted, corrupted);
    assert!((300..=500).contains(&corrupted), "corrupted {corrupted}");
}

#[test]
fn delay_holds_until_poll_at_later_time() {
    let net = MemNet::new();
    let cfg = ImpairConfig {
        delay: Duration::from_millis(2),
        jitter: Duration::from_millis(1),
        seed: 10,
        ..Default::default()
    };
    let (mut a, mut b) = pair(&net, cfg);
    let t = Instant::now();
    a.poll(t);
    let mut v: Vec<_> = (0..100)
        .map(|i| fill(&mut a, i, SocketAddrV4::new(B, B_PORT)))
        .collect();
    a.send_burst(&mut v);
    let mut got = Vec::new();
    assert_eq!(b.recv_burst(&mut got, 1000), 0);
    assert_eq!(a.stats().pending, 100);
    a.poll(t + Duration::from_micros(1999));
    assert_eq!(b.recv_burst(&mut got, 1000), 0);
    a.poll(t + Duration::from_micros(2500));
    let early = b.recv_burst(&mut got, 1000);
    assert!(early > 10 && early < 90, "{early} released by 2.5ms");
    // Polling the receiver does not release the sender's packets.
    b.poll(t + Duration::from_millis(10));
    assert_eq!(b.recv_burst(&mut got, 1000), 0);
    a.poll(t + Duration::from_millis(3));
    assert_eq!(b.recv_burst(&mut got, 1000), 100 - early);
    assert_eq!(a.stats().pending, 0);
}

#[test]
fn same_seed_same_run_different_seed_differs() {
    fn run(seed: u64, t: Instant) -> (Vec<(Vec<u8>, SocketAddrV4)>, u64) {
        let net = MemNet::new();
        let cfg = ImpairConfig {
            loss: 0.05,
            duplicate: 0.05,
            reorder: 0.05,
            corrupt: 0.05,
            delay: Duration::from_micros(50),
            jitter: Duration::from_micros(100),
            seed,
        };
        let (mut a, mut b) = pair(&net, cfg);
        let to = SocketAddrV4::new(B, B_PORT);
        let mut got = Vec::new();
        for step in 0..200u32 {
            let now = t + Duration::from_micros(u64::from(step) * 10);
            a.poll(now);
            let mut v: Vec<_> = (step * 20..step * 20 + 20)
                .map(|i| fill(&mut a, i, to))
                .collect();
            a.send_burst(&mut v);
            b.recv_burst(&mut got, usize::MAX);
        }
        a.poll(t + Duration::from_secs(1));
        b.recv_burst(&mut got, usize::MAX);
        let s = a.stats().impair;
        let summary = s.dropped * 1_000_000 + s.duplicated * 1000 + s.corrupted;
        (
            got.iter()
                .map(|d| (d.payload().to_vec(), d.peer()))
                .collect(),
            summary,
        )
    }
    let t = Instant::now();
    let first = run(1234, t);
    assert_eq!(first, run(1234, t));
    // Absolute time does not matter, only the relative `now` values.
    assert_eq!(first, run(1234, t + Duration::from_secs(5)));
    assert_ne!(first, run(1235, t));
}

#[test]
fn bounded_rx_queue_overflow_is_counted() {
    let net = MemNet::with_config(MemNetConfig {
        mtu: 1500,
        rx_capacity: 100,
    });
    let (mut a, mut b) = pair(&net, ImpairConfig::default());
    let mut v: Vec<_> = (0..250)
        .map(|i| fill(&mut a, i, SocketAddrV4::new(B, B_PORT)))
        .collect();
    assert_eq!(a.send_burst(&mut v), 250);
    assert_eq!(b.stats().rx_overflow, 150);
    assert_eq!(a.stats().dest_full, 150);
    let mut got = Vec::new();
    assert_eq!(b.recv_burst(&mut got, 1000), 100);
    assert_eq!(
        got.iter().map(index).collect::<Vec<_>>(),
        (0..100).collect::<Vec<_>>()
    );
    // Room again after draining.
    let mut v = vec![fill(&mut a, 7, SocketAddrV4::new(B, B_PORT))];
    a.send_burst(&mut v);
    assert_eq!(b.recv_burst(&mut got, 1000), 1);
}

#[test]
fn default_rx_capacity_is_4096() {
    let net = MemNet::new();
    let (mut a, b) = pair(&net, ImpairConfig::default());
    let mut v: Vec<_> = (0..5000)
        .map(|i| fill(&mut a, i, SocketAddrV4::new(B, B_PORT)))
        .collect();
    a.send_burst(&mut v);
    assert_eq!((b.stats().rx_queued, b.stats().rx_overflow), (4096, 904));
}

#[test]
fn no_route_is_counted_and_dropped_endpoint_becomes_unreachable() {
    let net = MemNet::new();
    let (mut a, b) = pair(&net, ImpairConfig::default());
    let nowhere = SocketAddrV4::new(Ipv4Addr::new(10, 9, 9, 9), 1);
    let mut v: Vec<_> = (0..3).map(|i| fill(&mut a, i, nowhere)).collect();
    assert_eq!(a.send_burst(&mut v), 3);
    assert_eq!(a.stats().no_route, 3);
    drop(b);
    let mut v = vec![fill(&mut a, 0, SocketAddrV4::new(B, B_PORT))];
    a.send_burst(&mut v);
    assert_eq!(a.stats().no_route, 4);
    // The address is free again, and the new endpoint starts empty.
    let mut b2 = net.endpoint(B, ImpairConfig::default()).unwrap();
    let mut v = vec![fill(&mut a, 5, SocketAddrV4::new(B, B_PORT))];
    a.send_burst(&mut v);
    let mut got = Vec::new();
    assert_eq!(b2.recv_burst(&mut got, 10), 1);
    assert_eq!(index(&got[0]), 5);
}

#[test]
fn delayed_packet_to_endpoint_dropped_meanwhile_is_no_route() {
    let net = MemNet::new();
    let cfg = ImpairConfig {
        delay: Duration::from_millis(1),
        ..Default::default()
    };
    let (mut a, b) = pair(&net, cfg);
    let t = Instant::now();
    a.poll(t);
    let mut v = vec![fill(&mut a, 0, SocketAddrV4::new(B, B_PORT))];
    a.send_burst(&mut v);
    drop(b);
    a.poll(t + Duration::from_millis(1));
    assert_eq!(a.stats().no_route, 1);
}

#[test]
fn loopback_to_own_address() {
    let net = MemNet::new();
    let mut a = net.endpoint(A, ImpairConfig::default()).unwrap();
    let mut v = vec![fill(&mut a, 3, SocketAddrV4::new(A, 9))];
    a.send_burst(&mut v);
    let mut got = Vec::new();
    assert_eq!(a.recv_burst(&mut got, 4), 1);
    assert_eq!(
        (got[0].peer(), got[0].local_port()),
        (SocketAddrV4::new(A, A_PORT), 9)
    );
}

#[test]
fn impair_config_from_str() {
    let c: ImpairConfig =
        "loss=0.05,dup=0.01,reorder=0.1,corrupt=0.001,delay=2ms,jitter=1ms,seed=7"
            .parse()
            .unwrap();
    assert_eq!(
        (c.loss, c.duplicate, c.reorder, c.corrupt, c.seed),
        (0.05, 0.01, 0.1, 0.001, 7)
    );
    assert_eq!(
        (c.delay, c.jitter),
        (Duration::from_millis(2), Duration::from_millis(1))
    );
    assert_eq!(
        "delay=300us".parse::<ImpairConfig>().unwrap().delay,
        Duration::from_micros(300)
    );
    for bad in [
        "loss=2",
        "loss=x",
        "delay=3",
        "delay=3min",
        "seed=1.5",
        "nope=1",
        "loss",
    ] {
        let err = bad.parse::<ImpairConfig>().unwrap_err();
        let key = bad.split('=').next().unwrap();
        assert!(
            err.contains(key),
            "`{bad}`: error `{err}` does not name `{key}`"
        );
    }
}

#[test]
fn impaired_wrapper_full_loss_delivers_nothing() {
    let net = MemNet::new();
    let (a, mut b) = pair(&net, ImpairConfig::default());
    let mut a = Impaired::new(
        a,
        ImpairConfig {
            loss: 1.0,
            ..Default::default()
        },
    )
    .unwrap();
    let mut v: Vec<_> = (0..1000)
        .map(|i| fill(&mut a, i, SocketAddrV4::new(B, B_PORT)))
        .collect();
    assert_eq!(a.send_burst(&mut v), 1000);
    a.poll(Instant::now() + Duration::from_secs(1));
    let mut got = Vec::new();
    assert_eq!(b.recv_burst(&mut got, 10_000), 0);
    assert_eq!(a.stats().dropped, 1000);
    assert_eq!(a.inner().stats().sent, 0);
}

#[test]
fn impaired_wrapper_perfect_delivers_everything() {
    let net = MemNet::new();
    let (a, mut b) = pair(&net, ImpairConfig::default());
    let mut a = Impaired::new(a, ImpairConfig::default()).unwrap();
    assert_eq!((a.local_ip(), a.max_payload()), (A, 1472));
    let t = Instant::now();
    a.poll(t);
    let mut got = Vec::new();
    for start in (0..5000).step_by(100) {
        let mut v: Vec<_> = (start..start + 100)
            .map(|i| fill(&mut a, i, SocketAddrV4::new(B, B_PORT)))
            .collect();
        a.send_burst(&mut v);
        b.recv_burst(&mut got, usize::MAX);
    }
    assert_eq!(got.len(), 5000);
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d.payload(), payload(i as u32).as_slice());
        assert_eq!(
            (d.peer(), d.local_port()),
            (SocketAddrV4::new(A, A_PORT), B_PORT)
        );
    }
    assert_eq!(a.pending(), 0);
}

#[test]
fn impaired_wrapper_duplicates_via_inner_alloc_and_delays() {
    let net = MemNet::new();
    let (a, mut b) = pair(&net, ImpairConfig::default());
    let cfg = ImpairConfig {
        duplicate: 1.0,
        delay: Duration::from_millis(1),
        ..Default::default()
    };
    let mut a = Impaired::new(a, cfg).unwrap();
    let t = Instant::now();
    a.poll(t);
    let mut v: Vec<_> = (0..50)
        .map(|i| fill(&mut a, i, SocketAddrV4::new(B, B_PORT)))
        .collect();
    a.send_burst(&mut v);
    let mut got = Vec::new();
    assert_eq!(b.recv_burst(&mut got, 1000), 0);
    assert_eq!(a.pending(), 100);
    a.poll(t + Duration::from_millis(1));
    assert_eq!(b.recv_burst(&mut got, 1000), 100);
    let mut idx: Vec<u32> = got.iter().map(index).collect();
    idx.dedup();
    assert_eq!(idx, (0..50).collect::<Vec<_>>());
    assert!(got
        .iter()
        .all(|d| d.payload() == payload(index(d)).as_slice()));
    assert_eq!(a.stats().duplicated, 50);
}

#[test]
fn endpoints_work_across_threads() {
    let net = MemNet::new();
    let (mut a, mut b) = pair(&net, ImpairConfig::default());
    let sender = std::thread::spawn(move || {
        for i in 0..1000 {
            let mut v = vec![fill(&mut a, i, SocketAddrV4::new(B, B_PORT))];
            a.send_burst(&mut v);
        }
        a
    });
    let a = sender.join().unwrap();
    let mut got = Vec::new();
    assert_eq!(b.recv_burst(&mut got, 2000), 1000);
    drop(a);
}
