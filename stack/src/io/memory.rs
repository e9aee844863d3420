//! An in-process network for tests and experiments: any number of
//! [`MemEndpoint`]s, one per IPv4 address, exchange UDP datagrams through
//! shared queues, each sender's traffic passing through its own seeded
//! [`Impairment`].
//!
//! This is a test/experiment device, not a fast path: a [`MemNet`] is a
//! cloneable handle to one `Arc<Mutex<..>>`, locked once per `send_burst`,
//! `recv_burst`, `poll` and `stats` call, so endpoints may live on different
//! threads.
//!
//! Time: an endpoint never reads the clock after it is made. `send_burst`
//! uses the `now` of the endpoint's latest `poll` (its creation time before
//! the first); copies due then reach the destination at once, delayed ones
//! when the *sending* endpoint is polled at or after their release time.
//! With a virtual clock, call `poll(t)` with your own `t` values; the same
//! seeds, calls and `t` values give the same deliveries.
//!
//! Delivery: a datagram sent with `local_port = p`, `peer = B:q` from
//! address A arrives at B with `peer = A:p`, `local_port = q`. One to an
//! address no endpoint has is dropped (`no_route`), one to a full receive
//! queue too (`rx_overflow` at the receiver, `dest_full` at the sender).
//! Dropping an endpoint frees its address; datagrams still in its queues are
//! lost.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::mem;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::impair::{ImpairConfig, ImpairStats, Impairment};
use super::{Datagram, PacketIo};

pub const DEFAULT_MTU: usize = 1500;
pub const DEFAULT_RX_CAPACITY: usize = 4096;
/// IPv4 (20) + UDP (8) header bytes: `max_payload = mtu - 28`.
pub const UDP_IPV4_OVERHEAD: usize = 28;
/// The smallest MTU IPv4 allows.
pub const MIN_MTU: usize = 68;
/// At most this many spare buffers are kept per endpoint for `alloc`.
const FREE_LIST_MAX: usize = 1024;

/// Datagrams of the in-memory network live in heap buffers.
pub type MemDatagram = super::heap::HeapDatagram;

/// Network-wide settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemNetConfig {
    /// IP MTU; `max_payload = mtu - 28`. At least [`MIN_MTU`].
    pub mtu: usize,
    /// Datagrams each endpoint's receive queue holds.
    pub rx_capacity: usize,
}

impl Default for MemNetConfig {
    fn default() -> Self {
        MemNetConfig {
            mtu: DEFAULT_MTU,
            rx_capacity: DEFAULT_RX_CAPACITY,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum MemNetError {
    /// Another live endpoint has this address.
    AddressInUse(Ipv4Addr),
    /// The impairment config does not validate.
    InvalidImpairment(String),
}

impl fmt::Display for MemNetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemNetError::AddressInUse(a) => {
                write!(f, "address {a} is already in use on this MemNet")
            }
            MemNetError::InvalidImpairment(e) => write!(f, "invalid impairment: {e}"),
        }
    }
}

impl std::error::Error for MemNetError {}

struct Slot {
    id: u64,
    rx: VecDeque<MemDatagram>,
    rx_overflow: u64,
}

struct NetInner {
    max_payload: usize,
    rx_capacity: usize,
    slots: HashMap<Ipv4Addr, Slot>,
    next_id: u64,
}

/// A handle to one in-process network; clones share it.
#[derive(Clone)]
pub struct MemNet {
    inner: Arc<Mutex<NetInner>>,
}

impl fmt::Debug for MemNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.lock();
        f.debug_struct("MemNet")
            .field("max_payload", &n.max_payload)
            .field("rx_capacity", &n.rx_capacity)
            .field("endpoints", &n.slots.len())
            .finish()
    }
}

impl Default for MemNet {
    fn default() -> Self {
        Self::new()
    }
}

impl MemNet {
    /// MTU 1500, receive queues of 4096.
    pub fn new() -> Self {
        Self::with_config(MemNetConfig::default())
    }

    /// # Panics
    /// If `mtu < MIN_MTU`.
    pub fn with_mtu(mtu: usize) -> Self {
        Self::with_config(MemNetConfig {
            mtu,
            ..MemNetConfig::default()
        })
    }

    /// # Panics
    /// If `config.mtu < MIN_MTU`.
    pub fn with_config(config: MemNetConfig) -> Self {
        assert!(
            config.mtu >= MIN_MTU,
            "MemNet MTU {} below the IPv4 minimum {MIN_MTU}",
            config.mtu
        );
        MemNet {
            inner: Arc::new(Mutex::new(NetInner {
                max_payload: config.mtu - UDP_IPV4_OVERHEAD,
                rx_capacity: config.rx_capacity,
                slots: HashMap::new(),
                next_id: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, NetInner> {
        // A panic elsewhere while holding the lock leaves queues consistent
        // enough for a test device.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn max_payload(&self) -> usize {
        self.lock().max_payload
    }

    /// Addresses of the live endpoints, sorted.
    pub fn addresses(&self) -> Vec<Ipv4Addr> {
        let mut v: Vec<_> = self.lock().slots.keys().copied().collect();
        v.sort();
        v
    }

    /// A new endpoint at `addr` whose sent traffic goes through `impair`.
    /// Its clock starts at `Instant::now()`; call `poll` to set it.
    pub fn endpoint(
        &self,
        addr: Ipv4Addr,
        impair: ImpairConfig,
    ) -> Result<MemEndpoint, MemNetError> {
        let impairment = Impairment::new(impair).map_err(MemNetError::InvalidImpairment)?;
        let mut n = self.lock();
        if n.slots.contains_key(&addr) {
            return Err(MemNetError::AddressInUse(addr));
        }
        let id = n.next_id;
        n.next_id += 1;
        n.slots.insert(
            addr,
            Slot {
                id,
                rx: VecDeque::new(),
                rx_overflow: 0,
            },
        );
        let max_payload = n.max_payload;
        drop(n);
        Ok(MemEndpoint {
            net: self.clone(),
            addr,
            id,
            max_payload,
            impair: impairment,
            now: Instant::now(),
            free: Vec::new(),
            due: Vec::new(),
            counters: Counters::default(),
        })
    }
}

#[derive(Default, Clone, Copy)]
struct Counters {
    sent: u64,
    received: u64,
    no_route: u64,
    dest_full: u64,
    oversize: u64,
}

/// Per-endpoint counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Datagrams accepted by `send_burst`.
    pub sent: u64,
    /// Datagrams returned by `recv_burst`.
    pub received: u64,
    /// Sent datagrams dropped: no endpoint has the destination address.
    pub no_route: u64,
    /// Sent datagrams dropped: the destination's receive queue was full.
    pub dest_full: u64,
    /// Sent datagrams dropped: payload longer than `max_payload`.
    pub oversize: u64,
    /// Datagrams to this endpoint dropped: its receive queue was full.
    pub rx_overflow: u64,
    /// Datagrams waiting in this endpoint's receive queue.
    pub rx_queued: usize,
    /// Sent copies waiting in the delay queue.
    pub pending: usize,
    /// What the sender-side impairment did (loss is `impair.dropped`).
    pub impair: ImpairStats,
}

/// One address on a [`MemNet`]; see the module docs.
pub struct MemEndpoint {
    net: MemNet,
    addr: Ipv4Addr,
    id: u64,
    max_payload: usize,
    impair: Impairment<MemDatagram>,
    now: Instant,
    free: Vec<MemDatagram>,
    due: Vec<MemDatagram>,
    counters: Counters,
}

impl fmt::Debug for MemEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemEndpoint")
            .field("addr", &self.addr)
            .field("impair", self.impair.config())
            .finish()
    }
}

impl MemEndpoint {
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    pub fn net(&self) -> &MemNet {
        &self.net
    }

    pub fn stats(&self) -> EndpointStats {
        let (rx_overflow, rx_queued) = self
            .net
            .lock()
            .slots
            .get(&self.addr)
            .filter(|s| s.id == self.id)
            .map_or((0, 0), |s| (s.rx_overflow, s.rx.len()));
        let c = self.counters;
        EndpointStats {
            sent: c.sent,
            received: c.received,
            no_route: c.no_route,
            dest_full: c.dest_full,
            oversize: c.oversize,
            rx_overflow,
            rx_queued,
            pending: self.impair.pending(),
            impair: self.impair.stats(),
        }
    }

    /// Give a buffer (a received one, say) back for `alloc` to reuse.
    pub fn recycle(&mut self, buf: MemDatagram) {
        if self.free.len() < FREE_LIST_MAX && buf.capacity() == self.max_payload {
            self.free.push(buf);
        }
    }

    /// Deliver every sent copy due at `self.now`.
    fn flush(&mut self) {
        if self.impair.release(self.now, &mut self.due) == 0 {
            return;
        }
        let mut due = mem::take(&mut self.due);
        let mut undelivered = Vec::new();
        {
            let mut net = self.net.lock();
            let rx_capacity = net.rx_capacity;
            for mut d in due.drain(..) {
                if d.len > self.max_payload {
                    self.counters.oversize += 1;
                    undelivered.push(d);
                    continue;
                }
                let dest = *d.peer.ip();
                let Some(slot) = net.slots.get_mut(&dest) else {
                    self.counters.no_route += 1;
                    undelivered.push(d);
                    continue;
                };
                if slot.rx.len() >= rx_capacity {
                    slot.rx_overflow += 1;
                    self.counters.dest_full += 1;
                    undelivered.push(d);
                    continue;
                }
                let dst_port = d.peer.port();
                d.peer = SocketAddrV4::new(self.addr, d.local_port);
                d.local_port = dst_port;
                slot.rx.push_back(d);
            }
        }
        self.due = due;
        for d in undelivered {
            self.recycle(d);
        }
    }
}

impl Drop for MemEndpoint {
    fn drop(&mut self) {
        let mut net = self.net.lock();
        if net.slots.get(&self.addr).is_some_and(|s| s.id == self.id) {
            net.slots.remove(&self.addr);
        }
    }
}

impl PacketIo for MemEndpoint {
    type Buf = MemDatagram;

    fn recv_burst(&mut self, out: &mut Vec<MemDatagram>, max: usize) -> usize {
        let mut net = self.net.lock();
        let Some(slot) = net.slots.get_mut(&self.addr).filter(|s| s.id == self.id) else {
            return 0;
        };
        let n = max.min(slot.rx.len());
        out.extend(slot.rx.drain(..n));
        self.counters.received += n as u64;
        n
    }

    /// Never `None`: reuses a recycled buffer or allocates one.
    fn alloc(&mut self) -> Option<MemDatagram> {
        Some(match self.free.pop() {
            Some(mut b) => {
                b.reset();
                b
            }
            None => MemDatagram::new(self.max_payload),
        })
    }

    /// Takes every datagram: each goes through this endpoint's impairment;
    /// those due now are delivered at once, the others on a later `poll`.
    fn send_burst(&mut self, bufs: &mut Vec<MemDatagram>) -> usize {
        let n = bufs.len();
        self.counters.sent += n as u64;
        let free = &mut self.free;
        for b in bufs.drain(..) {
            self.impair.offer(b, self.now, |orig| {
                let mut copy = free.pop().unwrap_or_else(|| MemDatagram::new(0));
                copy.clone_from(orig);
                Some(copy)
            });
        }
        self.flush();
        n
    }

    fn release(&mut self, buf: MemDatagram) {
        self.recycle(buf);
    }

    /// Sets the endpoint's clock to `now` and delivers the sent copies due
    /// by then.
    fn poll(&mut self, now: Instant) {
        self.now = now;
        self.flush();
    }

    fn local_ip(&self) -> Ipv4Addr {
        self.addr
    }

    fn max_payload(&self) -> usize {
        self.max_payload
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 0, last)
    }

    #[test]
    fn address_in_use_and_freed_on_drop() {
        let net = MemNet::new();
        let a = net.endpoint(ip(1), ImpairConfig::default()).unwrap();
        assert_eq!(
            net.endpoint(ip(1), ImpairConfig::default()).unwrap_err(),
            MemNetError::AddressInUse(ip(1))
        );
        assert_eq!(net.addresses(), [ip(1)]);
        drop(a);
        assert!(net.addresses().is_empty());
        assert!(net.endpoint(ip(1), ImpairConfig::default()).is_ok());
    }

    #[test]
    fn invalid_impairment_is_rejected() {
        let net = MemNet::new();
        let bad = ImpairConfig {
            loss: 2.0,
            ..Default::default()
        };
        assert!(matches!(
            net.endpoint(ip(1), bad),
            Err(MemNetError::InvalidImpairment(_))
        ));
    }

    #[test]
    fn mtu_sets_max_payload_and_alloc() {
        let net = MemNet::with_mtu(9000);
        let mut a = net.endpoint(ip(1), ImpairConfig::default()).unwrap();
        assert_eq!(a.max_payload(), 8972);
        let b = a.alloc().unwrap();
        assert_eq!((b.capacity(), b.payload().len()), (8972, 0));
        assert_eq!(MemNet::new().max_payload(), 1472);
    }

    #[test]
    #[should_panic(expected = "beyond capacity")]
    fn set_len_beyond_capacity_panics() {
        MemDatagram::new(10).set_len(11);
    }

    #[test]
    fn recycled_buffers_are_reused_and_reset() {
        let net = MemNet::new();
        let mut a = net.endpoint(ip(1), ImpairConfig::default()).unwrap();
        let mut b = a.alloc().unwrap();
        b.set_len(5);
        b.set_local_port(9);
        a.recycle(b);
        let b = a.alloc().unwrap();
        assert_eq!((b.payload().len(), b.local_port()), (0, 0));
        assert!(a.free.is_empty());
    }
}
