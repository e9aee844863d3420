//! What the driver needs from a `PacketIo` beyond burst I/O: a way to
//! sleep until traffic arrives (so idle ranks give the core back; on the
//! DPDK stack, a short nap), and a
//! counting wrapper that measures what goes over the wire.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};
use nix::sys::time::TimeSpec;
use stack::io::kernel::KernelUdp;
use stack::io::{Datagram, PacketIo};
use stack::runtime::InlineStack;

use crate::error::{Error, Result};

/// A `PacketIo` the driver can block on.
pub trait Backend: PacketIo {
    /// Sleep until a datagram may be received (or, with `writable`, sent),
    /// or `timeout` passes. Spurious wake-ups are fine.
    fn wait(&mut self, writable: bool, timeout: Duration) -> Result<()>;

    /// The UDP port datagrams are sent from.
    fn local_port(&self) -> u16;

    /// Peer addresses found closed since the last call (nobody listens
    /// there: the peer's process is gone). Backends that cannot tell
    /// return none; a dead peer is then found by its liveness link to
    /// rank 0 (module `watch`), or else by its silence.
    fn take_closed_ports(&mut self) -> Vec<SocketAddrV4> {
        Vec::new()
    }
}

impl Backend for KernelUdp {
    fn wait(&mut self, writable: bool, timeout: Duration) -> Result<()> {
        stack::runtime::idle::tighten_timer_slack();
        let mut flags = PollFlags::POLLIN;
        if writable {
            flags |= PollFlags::POLLOUT;
        }
        let mut fds = [PollFd::new(self.as_fd(), flags)];
        match nix::poll::ppoll(&mut fds, Some(TimeSpec::from_duration(timeout)), None) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
            Err(e) => Err(Error::Transport(format!("poll on the UDP socket: {e}"))),
        }
    }

    fn local_port(&self) -> u16 {
        self.local_addr().port()
    }

    fn take_closed_ports(&mut self) -> Vec<SocketAddrV4> {
        KernelUdp::take_closed_ports(self)
    }
}

/// Longest nap of an idle rank on the DPDK stack: a poll-mode queue has
/// nothing to block on, so the loop naps and polls again. Short enough to
/// add little latency, long enough that ranks sharing a core let each
/// other run.
const DPDK_NAP: Duration = Duration::from_micros(50);

impl Backend for InlineStack {
    fn wait(&mut self, _writable: bool, timeout: Duration) -> Result<()> {
        stack::runtime::idle::tighten_timer_slack();
        std::thread::sleep(timeout.min(DPDK_NAP));
        Ok(())
    }

    fn local_port(&self) -> u16 {
        self.udp_port()
    }
}

/// Wire counters of a [`Counting`] backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireCounters {
    pub packets_sent: u64,
    pub bytes_sent: u64,
    pub packets_received: u64,
    pub bytes_received: u64,
}

/// Counts datagrams and payload bytes each way, and notes which known
/// peers were heard from (liveness without per-packet clock reads).
pub struct Counting<B> {
    pub inner: B,
    pub wire: WireCounters,
    /// Peer addresses to watch; `heard[i]` is set when `watch[i]` sends.
    watch: Vec<SocketAddrV4>,
    heard: Vec<bool>,
}

impl<B> Counting<B> {
    pub fn new(inner: B) -> Counting<B> {
        Counting {
            inner,
            wire: WireCounters::default(),
            watch: Vec::new(),
            heard: Vec::new(),
        }
    }

    /// Watch `addr`; returns its slot for [`Counting::take_heard`].
    pub fn watch(&mut self, addr: SocketAddrV4) -> usize {
        if let Some(i) = self.watch.iter().position(|a| *a == addr) {
            return i;
        }
        self.watch.push(addr);
        self.heard.push(false);
        self.watch.len() - 1
    }

    /// Slot `i` watches `addr` from now on (its peer moved there), unless
    /// another slot already does; returns the slot that does. A moved peer
    /// takes its slot along, so the list (scanned per datagram) does not
    /// grow with each move.
    pub fn rewatch(&mut self, i: usize, addr: SocketAddrV4) -> usize {
        if let Some(j) = self.watch.iter().position(|a| *a == addr) {
            return j;
        }
        self.watch[i] = addr;
        self.heard[i] = false;
        i
    }

    /// Whether slot `i` was heard from since the last call.
    pub fn take_heard(&mut self, i: usize) -> bool {
        std::mem::take(&mut self.heard[i])
    }
}

impl<B: PacketIo> PacketIo for Counting<B> {
    type Buf = B::Buf;

    fn recv_burst(&mut self, out: &mut Vec<Self::Buf>, max: usize) -> usize {
        let before = out.len();
        let n = self.inner.recv_burst(out, max);
        for d in &out[before..] {
            self.wire.packets_received += 1;
            self.wire.bytes_received += d.payload().len() as u64;
            let from = d.peer();
            // Few peers per endpoint: a scan beats hashing.
            if let Some(i) = self.watch.iter().position(|a| *a == from) {
                self.heard[i] = true;
            }
        }
        n
    }

    fn alloc(&mut self) -> Option<Self::Buf> {
        self.inner.alloc()
    }

    fn release(&mut self, buf: Self::Buf) {
        self.inner.release(buf)
    }

    fn send_burst(&mut self, bufs: &mut Vec<Self::Buf>) -> usize {
        let before: usize = bufs.iter().map(|b| b.payload().len()).sum();
        let n = self.inner.send_burst(bufs);
        let after: usize = bufs.iter().map(|b| b.payload().len()).sum();
        self.wire.packets_sent += n as u64;
        self.wire.bytes_sent += (before - after) as u64;
        n
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

    fn max_payload_to(&self, peer: SocketAddrV4) -> usize {
        self.inner.max_payload_to(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stack::io::kernel::KernelUdpConfig;

    #[test]
    fn a_moved_peer_takes_its_slot_along() {
        let local = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
        let mut io = Counting::new(KernelUdp::bind(local, KernelUdpConfig::default()).unwrap());
        let at = |port| SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), port);
        let (a, b) = (io.watch(at(1)), io.watch(at(2)));
        for port in 3..100 {
            assert_eq!(io.rewatch(a, at(port)), a);
        }
        assert_eq!(
            io.watch.len(),
            2,
            "one slot per peer, however often it moved"
        );
        assert_eq!(io.watch(at(99)), a);
        // Moving onto an address another slot watches: that slot.
        assert_eq!(io.rewatch(a, at(2)), b);
    }
}
