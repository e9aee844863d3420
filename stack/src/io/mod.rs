//! PacketIo: burst I/O of UDP datagrams, the one interface every layer above
//! the stack (QUIC, collectives) is written against. Backends:
//! - `dpdk`: our user-space stack (ARP, IPv4, ICMP, UDP) over a DPDK queue pair;
//! - `kernel`: kernel UDP sockets (recvmmsg/sendmmsg, GSO/GRO), the baseline;
//! - `memory`: an in-process network with seeded loss, duplication,
//!   reordering, corruption and delay (`Impairment`), also usable as a
//!   wrapper around any other backend.

pub mod dpdk;
pub mod heap;
pub mod impair;
pub mod kernel;
pub mod memory;
mod steering;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Instant;

/// One UDP datagram in a buffer owned by a backend (an mbuf, a heap slot).
/// Received: `peer` is the sender and `local_port` where it arrived.
/// To send: `peer` is the destination and `local_port` the source port.
pub trait Datagram {
    fn payload(&self) -> &[u8];
    fn payload_mut(&mut self) -> &mut [u8];
    /// Set the payload length, 0..=capacity(); bytes beyond the old length
    /// are unspecified until written.
    fn set_len(&mut self, len: usize);
    /// The largest payload this buffer holds.
    fn capacity(&self) -> usize;
    fn peer(&self) -> SocketAddrV4;
    fn set_peer(&mut self, peer: SocketAddrV4);
    fn local_port(&self) -> u16;
    fn set_local_port(&mut self, port: u16);
}

/// Burst datagram I/O. Nothing blocks: a call that has nothing to do
/// returns 0.
pub trait PacketIo {
    type Buf: Datagram;

    /// Append up to `max` received datagrams to `out`; returns how many.
    fn recv_burst(&mut self, out: &mut Vec<Self::Buf>, max: usize) -> usize;

    /// A buffer to send from, with `capacity() == max_payload()` and a
    /// payload length of 0; `None` when the backend is out of buffers.
    fn alloc(&mut self) -> Option<Self::Buf>;

    /// Send datagrams from the front of `bufs`; those sent (or dropped and
    /// counted by the backend) are removed, those the device has no room for
    /// stay at the front, in order, for the next call. Returns how many were
    /// removed.
    fn send_burst(&mut self, bufs: &mut Vec<Self::Buf>) -> usize;

    /// Hand back a buffer the caller is done with (a received datagram
    /// after processing, an allocated one left unsent). Backends that pool
    /// their buffers reuse it; the default drops it.
    fn release(&mut self, buf: Self::Buf) {
        drop(buf);
    }

    /// Timers and deferred work (ARP retries, delayed packets); call once
    /// per loop.
    fn poll(&mut self, now: Instant);

    /// The address datagrams are sent from.
    fn local_ip(&self) -> Ipv4Addr;

    /// The largest UDP payload one datagram can carry (MTU - 28 on Ethernet).
    fn max_payload(&self) -> usize;

    /// The largest UDP payload that reaches `peer` (a server learns the
    /// path only when a peer arrives). By default `max_payload()`: a port
    /// has one MTU for every peer.
    fn max_payload_to(&self, peer: SocketAddrV4) -> usize {
        let _ = peer;
        self.max_payload()
    }
}

/// A backend that reports its traffic in the stack's counters, so the
/// runtime's loop and the binaries print every backend alike.
pub trait CountedIo: PacketIo {
    fn counters(&self) -> crate::counters::Counters;

    /// Frames sent and frames handed to other lcores (software steering)
    /// so far: work for the loop's back-off even when the app got no
    /// datagram. Received frames are not counted: the app counts those it
    /// gets, and junk (others' broadcasts) is no reason to stay awake.
    fn frames_moved(&self) -> u64 {
        let c = self.counters();
        c.tx_packets + c.steered
    }
}
