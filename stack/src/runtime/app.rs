//! What runs on an lcore. The runtime owns the loop (stop flag, idle
//! backoff, timers, counters); an app does one round of work per call on
//! the lcore's I/O: the UDP services, a QUIC endpoint, a collective's shard.

use std::time::{Duration, Instant};

use super::services::Services;
use crate::counters::{Counters, DropReason};
use crate::io::dpdk::RX_BURST;
use crate::io::PacketIo;

pub trait LcoreApp<P: PacketIo> {
    /// One round: take received datagrams, do the work, hand datagrams to
    /// `io`. Returns how many moved (0 = idle, the loop backs off).
    fn poll(&mut self, io: &mut P) -> usize;

    /// After stop: give what is still queued a moment to leave.
    fn drain(&mut self, _io: &mut P) {}

    /// Drops decided by the app rather than the backend.
    fn counters(&self) -> Counters {
        Counters::default()
    }
}

/// Received datagrams and replies are held this many at most; beyond,
/// replies are dropped (counted) rather than buffered without bound.
const MAX_PENDING_TX: usize = 4 * RX_BURST;

/// The UDP services of one lcore as an app: rx burst, dispatch by port,
/// tx burst.
pub struct ServicesApp<B: crate::io::Datagram> {
    services: Services<B>,
    rx: Vec<B>,
    tx: Vec<B>,
    ours: Counters,
}

impl<B: crate::io::Datagram> ServicesApp<B> {
    pub fn new(services: Services<B>) -> Self {
        ServicesApp {
            services,
            rx: Vec::with_capacity(RX_BURST),
            tx: Vec::with_capacity(MAX_PENDING_TX),
            ours: Counters::default(),
        }
    }
}

impl<P: PacketIo> LcoreApp<P> for ServicesApp<P::Buf> {
    fn poll(&mut self, io: &mut P) -> usize {
        let got = io.recv_burst(&mut self.rx, RX_BURST);
        let unclaimed = self.services.dispatch_all(&mut self.rx, &mut self.tx);
        self.ours.drops[DropReason::NoListener as usize] += unclaimed as u64;
        if self.tx.len() > MAX_PENDING_TX {
            let excess = self.tx.len() - MAX_PENDING_TX;
            self.tx.truncate(MAX_PENDING_TX);
            self.ours.drops[DropReason::TxFull as usize] += excess as u64;
        }
        let sent = if self.tx.is_empty() {
            0
        } else {
            io.send_burst(&mut self.tx)
        };
        got + sent
    }

    fn drain(&mut self, io: &mut P) {
        let deadline = Instant::now() + Duration::from_millis(100);
        while !self.tx.is_empty() && Instant::now() < deadline {
            io.send_burst(&mut self.tx);
            io.poll(Instant::now());
        }
        self.ours.drops[DropReason::TxFull as usize] += self.tx.len() as u64;
        self.tx.clear();
    }

    fn counters(&self) -> Counters {
        self.ours.clone()
    }
}
