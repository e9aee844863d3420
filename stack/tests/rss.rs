//! Flows spread over lcores and stay put: 64 UDP flows from the kernel
//! through net_tap, with the PMD's multi-queue receive (RSS mode) and with
//! software steering from one rx queue.

mod common;

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};

use common::*;
use dpdk_ffi::Eal;
use stack::io::dpdk::UdpMbuf;
use stack::io::Datagram;
use stack::runtime::{RuntimeConfig, Services, SteeringMode, UdpHandler};

type Seen = Arc<Mutex<HashMap<u16, HashSet<usize>>>>;

/// Echo that notes which lcore served which flow (by the peer's port).
struct Recorder {
    lcore: usize,
    seen: Seen,
}

impl UdpHandler<UdpMbuf> for Recorder {
    fn on_datagram(&mut self, d: UdpMbuf, out: &mut Vec<UdpMbuf>) {
        self.seen
            .lock()
            .unwrap()
            .entry(d.peer().port())
            .or_default()
            .insert(self.lcore);
        out.push(d);
    }
}

/// The runtime on `cfg`, every lcore running a `Recorder` echo on port 7.
fn start_recording(eal: &Eal, cfg: &RuntimeConfig) -> (Running, Seen) {
    let seen: Seen = Arc::default();
    let s2 = seen.clone();
    let run = Running::start(eal, cfg, move |lcore| {
        let mut s = Services::new();
        s.listen(
            7,
            Box::new(Recorder {
                lcore,
                seen: s2.clone(),
            }),
        );
        s
    });
    (run, seen)
}

/// Where software steering over two lcores places flows.
fn software_placement() -> stack::rss::FlowPlacement {
    stack::rss::FlowPlacement {
        map: stack::rss::QueueMap {
            queues: 2,
            reta_size: 0,
        },
        key: stack::rss::DEFAULT_KEY.to_vec(),
    }
}

fn sixty_four_flows(
    mode: SteeringMode,
    subnet: u8,
) -> (HashMap<u16, HashSet<usize>>, SteeringMode) {
    let eal = eal("0-1");
    let us = Ipv4Addr::new(10, subnet, 0, 2);
    let kernel = Ipv4Addr::new(10, subnet, 0, 1);
    let iface = format!("ainfrss{subnet}");
    let mut cfg = RuntimeConfig::new(&format!("net_tap0,iface={iface}"), us, 24);
    cfg.steering = mode;
    let (run, seen) = start_recording(&eal, &cfg);
    tap_up(&iface, kernel, 24);
    let to = SocketAddrV4::new(us, 7);
    let socks: Vec<_> = (0..64).map(|_| udp_socket(kernel)).collect();
    for round in 0..10u8 {
        for (i, s) in socks.iter().enumerate() {
            echo_once(s, to, &pattern(100 + i, round));
        }
    }
    let report = run.finish();
    assert_eq!(report.mbufs_in_use_after_close, 0, "mbuf leak");
    let per_lcore: Vec<u64> = report.per_lcore.iter().map(|c| c.udp_in).collect();
    eprintln!("udp in per lcore: {per_lcore:?}");
    let seen = seen.lock().unwrap().clone();
    (seen, mode)
}

fn assert_spread_and_sticky(seen: &HashMap<u16, HashSet<usize>>) {
    assert_eq!(seen.len(), 64, "every flow was served");
    for (port, lcores) in seen {
        assert_eq!(
            lcores.len(),
            1,
            "flow from port {port} moved between lcores {lcores:?}"
        );
    }
    let used: HashSet<usize> = seen.values().flatten().copied().collect();
    assert_eq!(used.len(), 2, "64 flows landed on both lcores: {used:?}");
}

#[test]
fn software_steering_spreads_64_flows_and_keeps_each_on_one_lcore() {
    let (seen, _) = sixty_four_flows(SteeringMode::Software, 85);
    assert_spread_and_sticky(&seen);
    // Each flow is where the runtime's placement (what a connecting flow
    // picks its source port by) says it is.
    let placement = software_placement();
    let us = SocketAddrV4::new(Ipv4Addr::new(10, 85, 0, 2), 7);
    for (port, lcores) in &seen {
        let peer = SocketAddrV4::new(Ipv4Addr::new(10, 85, 0, 1), *port);
        let predicted = placement.lcore_of_reply(us, peer) as usize;
        assert!(
            lcores.contains(&predicted),
            "flow {port}: {lcores:?}, predicted {predicted}"
        );
    }
}

#[test]
fn multi_queue_receive_spreads_64_flows_and_keeps_each_on_one_lcore() {
    // net_tap has one queue per lcore; the kernel picks the queue by flow
    // hash, so this is the multi-queue path with no software hand-off.
    let (seen, _) = sixty_four_flows(SteeringMode::Auto, 86);
    assert_spread_and_sticky(&seen);
}

/// Which lcore gets a flow is known to the runtime where it decides it
/// (software steering) or can read it from the device (net_null's RSS: key
/// read back, redirection table set to i -> i % lcores), and unknown where
/// the kernel picks the queue (net_tap).
#[test]
fn flow_placement_is_known_where_the_runtime_or_device_decides_it() {
    use stack::rss::{FlowPlacement, QueueMap};
    use stack::runtime::Runtime;
    let eal = eal("0-1");
    let us = Ipv4Addr::new(10, 87, 0, 2);

    let nul = Runtime::start(&eal, &RuntimeConfig::new("net_null_place0", us, 24)).unwrap();
    assert_eq!(nul.steering(), SteeringMode::Rss);
    let reta_size = nul.port().info().reta_size;
    let want = FlowPlacement {
        map: QueueMap {
            queues: 2,
            reta_size,
        },
        key: nul.port().rss_key().unwrap(),
    };
    assert_eq!(nul.placement(), Some(&want));
    let reta = nul.port().rss_reta().unwrap();
    assert!(
        reta.iter().enumerate().all(|(i, &q)| q as usize == i % 2),
        "{reta:?}"
    );
    drop(nul);

    // --symmetric-rss: the device takes the symmetric key (read back from
    // it), so both directions of every flow land on one lcore.
    let mut sym = RuntimeConfig::new("net_null_place1", us, 24);
    sym.symmetric_rss = true;
    let nul = Runtime::start(&eal, &sym).unwrap();
    assert_eq!(nul.port().rss_key().unwrap(), stack::rss::SYMMETRIC_KEY);
    let p = nul.placement().expect("read from the device").clone();
    assert_eq!(p.key, stack::rss::SYMMETRIC_KEY);
    let remote = SocketAddrV4::new(Ipv4Addr::new(10, 87, 0, 1), 4433);
    let mut lcores = HashSet::new();
    for i in 0..64 {
        let local = SocketAddrV4::new(us, 40_000 + i);
        let reply = p.lcore_of_reply(local, remote);
        let sent = p.lcore_of_reply(remote, local);
        assert_eq!(reply, sent, "flow {local} <-> {remote}");
        lcores.insert(reply);
    }
    assert_eq!(lcores.len(), 2, "the flows still spread");
    drop(nul);

    let mut cfg = RuntimeConfig::new("net_tap0,iface=ainfplace0", us, 24);
    let tap = Runtime::start(&eal, &cfg).unwrap();
    assert_eq!(tap.steering(), SteeringMode::Rss);
    assert_eq!(tap.placement(), None, "the kernel picks net_tap's queue");
    drop(tap);

    // A PMD without RSS: auto falls back to software steering (and says
    // so in the log) rather than failing.
    let ring = Runtime::start(&eal, &RuntimeConfig::new("net_ring_place0", us, 24)).unwrap();
    assert_eq!(ring.port().features().rss_hf, 0, "net_ring has no RSS");
    assert_eq!(ring.steering(), SteeringMode::Software);
    assert!(ring.placement().is_some());
    drop(ring);

    cfg.steering = SteeringMode::Software;
    let sw = Runtime::start(&eal, &cfg).unwrap();
    let p = sw.placement().expect("software steering decides");
    assert_eq!(p.map.queues, 2);
    // Both lcores get some of 64 reply flows.
    let remote = SocketAddrV4::new(Ipv4Addr::new(10, 87, 0, 1), 4433);
    let lcores: HashSet<u16> = (0..64)
        .map(|i| p.lcore_of_reply(SocketAddrV4::new(us, 40_000 + i), remote))
        .collect();
    assert_eq!(lcores.len(), 2);
}

/// The lcore that owns the only rx queue hands every frame of lcore 1's
/// flows to lcore 1. With the adaptive idle policy it must not nap while
/// it does, though its own app gets nothing: napping there (100 us at a
/// time) held up every frame of the other lcores.
#[test]
fn the_steering_lcore_does_not_nap_while_it_steers_the_others_flows() {
    use std::time::{Duration, Instant};
    let eal = eal("0-1");
    let us = Ipv4Addr::new(10, 62, 0, 2);
    let kernel = Ipv4Addr::new(10, 62, 0, 1);
    let mut cfg = RuntimeConfig::new("net_tap0,iface=ainfrss62", us, 24);
    cfg.steering = SteeringMode::Software;
    cfg.idle = stack::runtime::IdlePolicy::Adaptive;
    let (run, seen) = start_recording(&eal, &cfg);
    tap_up("ainfrss62", kernel, 24);
    let to = SocketAddrV4::new(us, 7);
    // A flow software steering places on lcore 1.
    let placement = software_placement();
    let sock = std::iter::repeat_with(|| udp_socket(kernel))
        .find(|s| {
            let SocketAddr::V4(local) = s.local_addr().unwrap() else {
                unreachable!("bound to IPv4")
            };
            placement.lcore_of_reply(to, local) == 1
        })
        .unwrap();
    echo_once(&sock, to, b"first: ARP resolved on both sides");
    // A second without traffic: what the loop naps when idle here.
    let naps_of_lcore_0 = || run.counters[0].snapshot().idle_naps;
    let idle_from = naps_of_lcore_0();
    std::thread::sleep(Duration::from_secs(1));
    let idle = naps_of_lcore_0() - idle_from;
    // A second of a datagram every 200 us or so, all through lcore 0.
    sock.set_nonblocking(true).unwrap();
    let busy_from = naps_of_lcore_0();
    let start = Instant::now();
    let mut sent = 0u32;
    let mut buf = [0u8; 64];
    while start.elapsed() < Duration::from_secs(1) {
        sock.send_to(&sent.to_le_bytes(), to).unwrap();
        sent += 1;
        while sock.recv_from(&mut buf).is_ok() {}
        std::thread::sleep(Duration::from_micros(200));
    }
    let busy = naps_of_lcore_0() - busy_from;
    let report = run.finish();
    let steered = report.per_lcore[0].steered;
    eprintln!("lcore 0: {idle} naps in an idle second, {busy} in a second steering {steered} of {sent} frames");
    // The measure holds: an idle loop naps thousands of times a second.
    assert!(idle > 1000, "{idle} naps in an idle second");
    // A loop that counted only its own app's datagrams napped as often
    // while steering; this one naps only where this thread's sends were
    // held up for longer than the nap threshold.
    assert!(
        busy * 4 < idle,
        "lcore 0 napped {busy} times in a second while steering ({steered} of {sent} frames), {idle} when idle"
    );
    assert!(
        steered >= u64::from(sent) / 2,
        "{steered} of {sent} steered"
    );
    assert_eq!(
        seen.lock()
            .unwrap()
            .values()
            .flatten()
            .copied()
            .collect::<HashSet<_>>(),
        HashSet::from([1]),
        "only lcore 1 served the flow"
    );
}
