//! The lcore loop's back-off (`runtime::app_loop`): a loop whose app gets
//! no datagram naps once idle for long, but not while its backend moves
//! frames for other lcores (software steering: the receiving lcore hands
//! the others their flows, and napping there starves them all).

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use stack::counters::{Counters, SharedCounters};
use stack::io::impair::ImpairConfig;
use stack::io::memory::{MemDatagram, MemEndpoint, MemNet};
use stack::io::{CountedIo, PacketIo};
use stack::runtime::{app_loop, IdlePolicy, LcoreApp};

/// A backend that relays `per_poll` frames for other lcores on every
/// receive call and delivers nothing to its own app.
struct Relaying {
    inner: MemEndpoint,
    per_poll: u64,
    relayed: u64,
}

impl PacketIo for Relaying {
    type Buf = MemDatagram;

    fn recv_burst(&mut self, out: &mut Vec<MemDatagram>, max: usize) -> usize {
        self.relayed += self.per_poll;
        self.inner.recv_burst(out, max)
    }
    fn alloc(&mut self) -> Option<MemDatagram> {
        self.inner.alloc()
    }
    fn send_burst(&mut self, bufs: &mut Vec<MemDatagram>) -> usize {
        self.inner.send_burst(bufs)
    }
    fn poll(&mut self, now: Instant) {
        self.inner.poll(now)
    }
    fn local_ip(&self) -> Ipv4Addr {
        self.inner.local_ip()
    }
    fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }
}

impl CountedIo for Relaying {
    fn counters(&self) -> Counters {
        // As DpdkIo counts frames it hands to other lcores: steered, and
        // not received (the lcore that gets them counts them).
        Counters {
            steered: self.relayed,
            ..Counters::default()
        }
    }
}

/// An app that receives (finding nothing) and stops the loop after
/// `polls` polls.
struct Receiver<'a> {
    polls: u32,
    stop: &'a AtomicBool,
    rx: Vec<MemDatagram>,
}

impl LcoreApp<Relaying> for Receiver<'_> {
    fn poll(&mut self, io: &mut Relaying) -> usize {
        self.polls -= 1;
        if self.polls == 0 {
            self.stop.store(true, Ordering::Relaxed);
        }
        io.recv_burst(&mut self.rx, 32)
    }
}

/// Naps of a loop of `polls` polls over a backend relaying `per_poll`
/// frames per poll.
fn naps(per_poll: u64, polls: u32) -> u64 {
    let net = MemNet::new();
    let inner = net
        .endpoint(Ipv4Addr::new(10, 0, 0, 1), ImpairConfig::default())
        .unwrap();
    let mut io = Relaying {
        inner,
        per_poll,
        relayed: 0,
    };
    let stop = AtomicBool::new(false);
    let mut app = Receiver {
        polls,
        stop: &stop,
        rx: Vec::new(),
    };
    let published = SharedCounters::default();
    let c = app_loop(&mut io, &mut app, &stop, IdlePolicy::Adaptive, &published);
    assert_eq!(published.snapshot().idle_naps, c.idle_naps, "published too");
    c.idle_naps
}

#[test]
fn a_loop_that_relays_frames_for_other_lcores_never_naps() {
    // 5000 polls: the back-off naps from the 4096th idle one on.
    assert!(naps(0, 5000) > 500, "an idle loop naps");
    assert_eq!(naps(4, 5000), 0, "a relaying loop is not idle");
}
