//! The neighbour (ARP) cache. One table is shared by all lcores of a host,
//! but each lcore reads a private copy that it refreshes only when the
//! table's generation changes, so lookups on the fast path take no lock.
//! Packets waiting for a resolution are queued per lcore, bounded.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::wire::EthernetAddress;

#[derive(Debug, Clone, Copy)]
pub struct NeighbourConfig {
    /// How long a learned entry is trusted.
    pub reachable: Duration,
    /// Time between ARP requests for one address.
    pub retry: Duration,
    /// Requests sent before giving up and dropping the queued packets.
    pub max_requests: u32,
    /// Packets queued per unresolved address, and in all.
    pub queue_per_addr: usize,
    pub queue_total: usize,
}

impl Default for NeighbourConfig {
    fn default() -> Self {
        NeighbourConfig {
            reachable: Duration::from_secs(60),
            retry: Duration::from_millis(500),
            max_requests: 5,
            queue_per_addr: 16,
            queue_total: 1024,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    mac: EthernetAddress,
    /// None: static, never expires.
    expires: Option<Instant>,
}

/// The host-wide table.
#[derive(Debug, Default)]
pub struct NeighbourTable {
    entries: RwLock<HashMap<Ipv4Addr, Entry>>,
    generation: AtomicU64,
}

impl NeighbourTable {
    pub fn new() -> Arc<NeighbourTable> {
        Arc::new(NeighbourTable::default())
    }

    pub fn add_static(&self, ip: Ipv4Addr, mac: EthernetAddress) {
        self.insert(ip, Entry { mac, expires: None });
    }

    fn insert(&self, ip: Ipv4Addr, entry: Entry) {
        let mut map = self.entries.write().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = map.get(&ip) {
            if old.expires.is_none() {
                return; // static entries are not overridden by the wire
            }
        }
        map.insert(ip, entry);
        self.generation.fetch_add(1, Ordering::Release);
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn copy(&self) -> HashMap<Ipv4Addr, Entry> {
        self.entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn lookup(&self, ip: Ipv4Addr) -> Option<EthernetAddress> {
        let map = self.entries.read().unwrap_or_else(|e| e.into_inner());
        map.get(&ip).map(|e| e.mac)
    }

    pub fn len(&self) -> usize {
        self.entries.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

struct Pending<P> {
    packets: VecDeque<P>,
    requests_sent: u32,
    next_request: Instant,
}

/// What the caller must do after queueing a packet or on a timer.
#[derive(Debug, PartialEq, Eq)]
pub enum Resolve {
    /// Send an ARP request for this address now.
    SendRequest(Ipv4Addr),
    /// A request is already outstanding; the packet waits.
    Waiting,
    /// The packet could not be queued (limits); it is handed back.
    Full,
}

/// One lcore's view of the table plus its queue of waiting packets.
pub struct NeighbourCache<P> {
    table: Arc<NeighbourTable>,
    cfg: NeighbourConfig,
    local: HashMap<Ipv4Addr, Entry>,
    local_generation: u64,
    /// The last address looked up: a flow's packets ask for the same
    /// next hop again and again, and this skips the hash.
    last: Option<(Ipv4Addr, Entry)>,
    pending: HashMap<Ipv4Addr, Pending<P>>,
    queued: usize,
}

impl<P> NeighbourCache<P> {
    pub fn new(table: Arc<NeighbourTable>, cfg: NeighbourConfig) -> Self {
        let local_generation = table.generation();
        let local = table.copy();
        NeighbourCache {
            table,
            cfg,
            local,
            local_generation,
            last: None,
            pending: HashMap::new(),
            queued: 0,
        }
    }

    pub fn table(&self) -> &Arc<NeighbourTable> {
        &self.table
    }

    /// The MAC of `ip` if known and not expired.
    pub fn lookup(&mut self, ip: Ipv4Addr, now: Instant) -> Option<EthernetAddress> {
        let generation = self.table.generation();
        if generation != self.local_generation {
            self.local = self.table.copy();
            self.local_generation = generation;
            self.last = None;
        }
        let entry = match self.last {
            Some((last_ip, e)) if last_ip == ip => Some(e),
            _ => {
                let e = self.local.get(&ip).copied();
                if let Some(e) = e {
                    self.last = Some((ip, e));
                }
                e
            }
        };
        entry
            .filter(|e| e.expires.is_none_or(|t| t > now))
            .map(|e| e.mac)
    }

    /// Record what the wire told us (ARP request or reply) and hand back
    /// the packets that were waiting for `ip`.
    pub fn learn(&mut self, ip: Ipv4Addr, mac: EthernetAddress, now: Instant) -> Vec<P> {
        self.table.insert(
            ip,
            Entry {
                mac,
                expires: Some(now + self.cfg.reachable),
            },
        );
        self.take_pending(ip)
    }

    /// Hand back packets waiting for `ip` if another lcore resolved it.
    pub fn take_resolved(&mut self, now: Instant) -> Vec<(EthernetAddress, Vec<P>)> {
        let ready: Vec<Ipv4Addr> = self.pending.keys().copied().collect();
        let mut out = Vec::new();
        for ip in ready {
            if let Some(mac) = self.lookup(ip, now) {
                out.push((mac, self.take_pending(ip)));
            }
        }
        out
    }

    fn take_pending(&mut self, ip: Ipv4Addr) -> Vec<P> {
        match self.pending.remove(&ip) {
            Some(p) => {
                self.queued -= p.packets.len();
                p.packets.into()
            }
            None => Vec::new(),
        }
    }

    /// Queue `packet` until `ip` resolves.
    pub fn enqueue(&mut self, ip: Ipv4Addr, packet: P, now: Instant) -> (Resolve, Option<P>) {
        if self.queued >= self.cfg.queue_total {
            return (Resolve::Full, Some(packet));
        }
        let retry = self.cfg.retry;
        let pending = self.pending.entry(ip).or_insert_with(|| Pending {
            packets: VecDeque::new(),
            requests_sent: 0,
            next_request: now,
        });
        if pending.packets.len() >= self.cfg.queue_per_addr {
            return (Resolve::Full, Some(packet));
        }
        pending.packets.push_back(packet);
        self.queued += 1;
        if pending.requests_sent == 0 {
            pending.requests_sent = 1;
            pending.next_request = now + retry;
            (Resolve::SendRequest(ip), None)
        } else {
            (Resolve::Waiting, None)
        }
    }

    /// Timer work: addresses to ask again for, and packets given up on.
    pub fn poll(&mut self, now: Instant) -> (Vec<Ipv4Addr>, Vec<P>) {
        let mut ask = Vec::new();
        let mut expired = Vec::new();
        for (ip, p) in self.pending.iter_mut() {
            if now < p.next_request {
                continue;
            }
            if p.requests_sent >= self.cfg.max_requests {
                expired.push(*ip);
            } else {
                p.requests_sent += 1;
                p.next_request = now + self.cfg.retry;
                ask.push(*ip);
            }
        }
        let mut dropped = Vec::new();
        for ip in expired {
            dropped.extend(self.take_pending(ip));
        }
        (ask, dropped)
    }

    pub fn queued(&self) -> usize {
        self.queued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 9]);
    const IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 9);

    fn cache(cfg: NeighbourConfig) -> NeighbourCache<u32> {
        NeighbourCache::new(NeighbourTable::new(), cfg)
    }

    #[test]
    fn queued_packets_are_released_when_the_address_resolves() {
        let mut c = cache(NeighbourConfig::default());
        let t0 = Instant::now();
        assert_eq!(c.lookup(IP, t0), None);
        assert_eq!(c.enqueue(IP, 1, t0), (Resolve::SendRequest(IP), None));
        assert_eq!(c.enqueue(IP, 2, t0), (Resolve::Waiting, None));
        assert_eq!(c.queued(), 2);
        assert_eq!(c.learn(IP, MAC, t0), vec![1, 2]);
        assert_eq!(c.queued(), 0);
        assert_eq!(c.lookup(IP, t0), Some(MAC));
    }

    #[test]
    fn entries_expire_and_statics_do_not() {
        let cfg = NeighbourConfig::default();
        let mut c = cache(cfg);
        let t0 = Instant::now();
        c.learn(IP, MAC, t0);
        let later = t0 + cfg.reachable + Duration::from_millis(1);
        assert_eq!(c.lookup(IP, later), None);
        let gw = Ipv4Addr::new(10, 0, 0, 1);
        c.table().add_static(gw, MAC);
        assert_eq!(c.lookup(gw, later + Duration::from_secs(3600)), Some(MAC));
        // The wire cannot override a static entry.
        c.learn(gw, EthernetAddress([2, 0, 0, 0, 0, 1]), later);
        assert_eq!(c.lookup(gw, later), Some(MAC));
    }

    #[test]
    fn requests_are_retried_then_packets_dropped() {
        let cfg = NeighbourConfig {
            max_requests: 3,
            ..NeighbourConfig::default()
        };
        let mut c = cache(cfg);
        let mut now = Instant::now();
        c.enqueue(IP, 7, now);
        let (ask, dropped) = c.poll(now);
        assert!(ask.is_empty() && dropped.is_empty(), "too early to retry");
        let mut asked = 1;
        loop {
            now += cfg.retry;
            let (ask, dropped) = c.poll(now);
            if !dropped.is_empty() {
                assert_eq!(dropped, vec![7]);
                break;
            }
            assert_eq!(ask, vec![IP]);
            asked += 1;
        }
        assert_eq!(asked, 3);
        assert_eq!(c.queued(), 0);
    }

    #[test]
    fn queues_are_bounded_per_address_and_in_total() {
        let cfg = NeighbourConfig {
            queue_per_addr: 2,
            queue_total: 3,
            ..NeighbourConfig::default()
        };
        let mut c = cache(cfg);
        let now = Instant::now();
        c.enqueue(IP, 1, now);
        c.enqueue(IP, 2, now);
        assert_eq!(c.enqueue(IP, 3, now), (Resolve::Full, Some(3)));
        let other = Ipv4Addr::new(10, 0, 0, 10);
        assert_eq!(c.enqueue(other, 4, now).0, Resolve::SendRequest(other));
        assert_eq!(c.enqueue(other, 5, now), (Resolve::Full, Some(5)));
    }

    #[test]
    fn another_lcore_sees_what_one_learned() {
        let table = NeighbourTable::new();
        let mut a: NeighbourCache<u32> = NeighbourCache::new(table.clone(), Default::default());
        let mut b: NeighbourCache<u32> = NeighbourCache::new(table, Default::default());
        let now = Instant::now();
        b.enqueue(IP, 42, now);
        a.learn(IP, MAC, now);
        assert_eq!(b.take_resolved(now), vec![(MAC, vec![42])]);
    }
}
