//! The stack on one queue, driven from the caller's own loop instead of
//! lcore threads: for a library (a collectives communicator) whose calls
//! poll the network while the caller waits in them.

use std::net::Ipv4Addr;
use std::time::Instant;

use dpdk_ffi::{Eal, Mempool, Port, PortStats};

use crate::counters::{Counters, DropReason};
use crate::io::dpdk::{DpdkIo, UdpMbuf};
use crate::io::{CountedIo, Datagram, PacketIo};

/// One port, one queue, one UDP port of ours; owns the port and closes it
/// when dropped. Datagrams to other UDP ports are dropped (counted as
/// `no_listener`).
pub struct InlineStack {
    io: DpdkIo,
    udp_port: u16,
    no_listener: u64,
    port: Port,
    pool: Mempool,
    _eal: Eal,
}

impl InlineStack {
    pub(super) fn new(
        mut io: DpdkIo,
        udp_port: u16,
        port: Port,
        pool: Mempool,
        eal: Eal,
    ) -> InlineStack {
        // Neighbours learn our MAC before the first datagram needs it.
        io.announce();
        InlineStack {
            io,
            udp_port,
            no_listener: 0,
            port,
            pool,
            _eal: eal,
        }
    }

    /// The UDP port this stack receives on and sends from.
    pub fn udp_port(&self) -> u16 {
        self.udp_port
    }

    pub fn port_stats(&self) -> PortStats {
        self.port.stats().unwrap_or_default()
    }

    /// Closes the port; returns the mbufs of our pool still out afterwards
    /// (0: nothing leaked).
    pub fn close(self) -> u32 {
        let InlineStack { io, port, pool, .. } = self;
        drop(io);
        drop(port);
        pool.in_use()
    }
}

impl PacketIo for InlineStack {
    type Buf = UdpMbuf;

    fn recv_burst(&mut self, out: &mut Vec<UdpMbuf>, max: usize) -> usize {
        let before = out.len();
        self.io.recv_burst(out, max);
        let port = self.udp_port;
        let mut index = 0;
        let mut dropped = 0;
        // Dropping a datagram returns its mbuf to the pool.
        out.retain(|d| {
            let keep = index < before || d.local_port() == port;
            index += 1;
            dropped += u64::from(!keep);
            keep
        });
        self.no_listener += dropped;
        out.len() - before
    }

    fn alloc(&mut self) -> Option<UdpMbuf> {
        let mut d = self.io.alloc()?;
        d.set_local_port(self.udp_port);
        Some(d)
    }

    fn send_burst(&mut self, bufs: &mut Vec<UdpMbuf>) -> usize {
        self.io.send_burst(bufs)
    }

    fn poll(&mut self, now: Instant) {
        self.io.poll(now)
    }

    fn local_ip(&self) -> Ipv4Addr {
        self.io.local_ip()
    }

    fn max_payload(&self) -> usize {
        self.io.max_payload()
    }
}

impl CountedIo for InlineStack {
    fn counters(&self) -> Counters {
        let mut c = self.io.counters();
        c.drops[DropReason::NoListener as usize] += self.no_listener;
        c
    }
}
