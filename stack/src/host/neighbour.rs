//! The neighbour (ARP) cache. One table is shared by all lcores of a host,
//! but each lcore reads a private copy that it refreshes only when the
//! table's generation changes, so lookups on the fast path take no lock.
//! Packets waiting for a resolution are queued per lcore, bounded.
//!
//! An entry past its `reachable` time is still used for `stale` more while
//! it is asked for again (Linux's STALE/PROBE): between two hosts that never
//! ask each other, a live flow would otherwise stop every `reachable` and
//! queue behind a fresh request. The table holds at most `max_entries`
//! learned addresses, so a host spraying ARP cannot grow it without end.

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
    /// How long an entry past `reachable` is still used while it is
    /// asked for again (every `retry`, up to `max_requests` times).
    pub stale: Duration,
    /// Learned (not static) entries the table holds; past that, expired
    /// ones are purged and new addresses are not learned.
    pub max_entries: usize,
}

impl Default for NeighbourConfig {
    fn default() -> Self {
        NeighbourConfig {
            reachable: Duration::from_secs(60),
            retry: Duration::from_millis(500),
            max_requests: 5,
            queue_per_addr: 16,
            queue_total: 1024,
            stale: Duration::from_millis(2500),
            max_entries: 4096,
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
        let mut map = self.entries.write().unwrap_or_else(|e| e.into_inner());
        map.insert(ip, Entry { mac, expires: None });
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Records a learned entry valid until `expires`; false if the table
    /// is full of live entries. Every change makes each lcore copy the
    /// table on its next lookup, so a refresh that only moves the expiry
    /// is taken only once the entry's expiry is half used up; an earlier
    /// one is ignored, so that the table always holds what the copies saw.
    fn learn(
        &self,
        ip: Ipv4Addr,
        mac: EthernetAddress,
        expires: Instant,
        cfg: &NeighbourConfig,
    ) -> bool {
        let mut map = self.entries.write().unwrap_or_else(|e| e.into_inner());
        match map.get(&ip) {
            // Static entries are not overridden by the wire.
            Some(old) if old.expires.is_none() => return true,
            Some(old) => {
                let due = old
                    .expires
                    .is_some_and(|t| expires.saturating_duration_since(t) >= cfg.reachable / 2);
                if old.mac == mac && !due {
                    return true;
                }
            }
            None => {
                let learned = map.values().filter(|e| e.expires.is_some()).count();
                if learned >= cfg.max_entries {
                    // Drop what is past use, stale time included.
                    let now = expires.checked_sub(cfg.reachable).unwrap_or(expires);
                    map.retain(|_, e| e.expires.is_none_or(|t| t + cfg.stale > now));
                    if map.values().filter(|e| e.expires.is_some()).count() >= cfg.max_entries {
                        return false;
                    }
                }
            }
        }
        map.insert(
            ip,
            Entry {
                mac,
                expires: Some(expires),
            },
        );
        self.generation.fetch_add(1, Ordering::Release);
        true
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
    /// Stale entries being asked for again: requests sent, next one due.
    probing: HashMap<Ipv4Addr, (u32, Instant)>,
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
            probing: HashMap::new(),
        }
    }

    pub fn table(&self) -> &Arc<NeighbourTable> {
        &self.table
    }

    /// The MAC of `ip` if known and not expired, or expired less than
    /// `stale` ago (then `poll` asks for it again).
    pub fn lookup(&mut self, ip: Ipv4Addr, now: Instant) -> Option<EthernetAddress> {
        self.sync();
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
        let e = entry?;
        match e.expires {
            Some(t) if t <= now => {
                if now >= t + self.cfg.stale {
                    return None;
                }
                self.probing.entry(ip).or_insert((0, now));
                Some(e.mac)
            }
            _ => Some(e.mac),
        }
    }

    /// Record what the wire told us (ARP request or reply) and hand back
    /// the packets that were waiting for `ip`.
    /// (Nothing is learned when the table is full of live entries; the
    /// packets are handed back all the same, as they are addressed.)
    pub fn learn(&mut self, ip: Ipv4Addr, mac: EthernetAddress, now: Instant) -> Vec<P> {
        self.table
            .learn(ip, mac, now + self.cfg.reachable, &self.cfg);
        self.probing.remove(&ip);
        self.take_pending(ip)
    }

    /// Copies the table if it changed since the last copy.
    fn sync(&mut self) {
        let generation = self.table.generation();
        if generation != self.local_generation {
            self.local = self.table.copy();
            self.local_generation = generation;
            self.last = None;
        }
    }

    /// Whether `ip` has an entry not past its `reachable` time.
    fn is_fresh(&mut self, ip: Ipv4Addr, now: Instant) -> bool {
        self.sync();
        self.local
            .get(&ip)
            .is_some_and(|e| e.expires.is_none_or(|t| t > now))
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
        // Stale entries: ask again until refreshed (here or by another
        // lcore) or out of tries, then let them go.
        let probing: Vec<Ipv4Addr> = self.probing.keys().copied().collect();
        for ip in probing {
            if self.is_fresh(ip, now) {
                self.probing.remove(&ip);
                continue;
            }
            let Some((sent, next)) = self.probing.get_mut(&ip) else {
                continue;
            };
            if now < *next {
                continue;
            }
            if *sent >= self.cfg.max_requests {
                self.probing.remove(&ip);
            } else {
                *sent += 1;
                *next = now + self.cfg.retry;
                ask.push(ip);
            }
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
        let later = t0 + cfg.reachable + cfg.stale + Duration::from_millis(1);
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
    fn a_stale_entry_is_still_used_while_it_is_asked_for_again() {
        let cfg = NeighbourConfig::default();
        let mut c = cache(cfg);
        let t0 = Instant::now();
        c.learn(IP, MAC, t0);
        assert!(c.poll(t0).0.is_empty(), "a fresh entry is not asked for");
        let stale = t0 + cfg.reachable + Duration::from_millis(1);
        assert_eq!(c.lookup(IP, stale), Some(MAC), "packets keep flowing");
        assert_eq!(c.poll(stale).0, vec![IP], "and the address is asked for");
        assert!(c.poll(stale).0.is_empty(), "once per retry");
        assert_eq!(c.poll(stale + cfg.retry).0, vec![IP]);
        // The answer refreshes it: no more requests, fresh again.
        c.learn(IP, MAC, stale + cfg.retry);
        assert!(c.poll(stale + cfg.retry * 2).0.is_empty());
        let later = stale + cfg.retry + cfg.reachable / 2;
        assert_eq!(c.lookup(IP, later), Some(MAC));
        assert!(c.poll(later).0.is_empty());
        // Unanswered, it is given up after `stale`.
        let gone = stale + cfg.retry + cfg.reachable + cfg.stale;
        assert_eq!(c.lookup(IP, gone), None);
    }

    #[test]
    fn a_refresh_learned_on_one_lcore_stops_the_requests_of_another() {
        let cfg = NeighbourConfig::default();
        let table = NeighbourTable::new();
        let mut a: NeighbourCache<u32> = NeighbourCache::new(table.clone(), cfg);
        let mut b: NeighbourCache<u32> = NeighbourCache::new(table, cfg);
        let t0 = Instant::now();
        a.learn(IP, MAC, t0);
        let stale = t0 + cfg.reachable + Duration::from_millis(1);
        assert_eq!(b.lookup(IP, stale), Some(MAC));
        a.learn(IP, MAC, stale);
        assert!(b.poll(stale).0.is_empty(), "b sees a's refresh");
    }

    #[test]
    fn refreshes_closer_than_half_a_lifetime_are_not_lost_to_the_other_lcores() {
        // A peer that asks for us every 25 s refreshes our entry for it;
        // the lcores must see the refresh before their copy expires.
        let cfg = NeighbourConfig::default();
        let table = NeighbourTable::new();
        let mut a: NeighbourCache<u32> = NeighbourCache::new(table.clone(), cfg);
        let mut b: NeighbourCache<u32> = NeighbourCache::new(table, cfg);
        let t0 = Instant::now();
        for k in 0..5u32 {
            let at = t0 + Duration::from_secs(25) * k;
            a.learn(IP, MAC, at);
            // b sends all along, so it holds a copy of the table.
            assert_eq!(b.lookup(IP, at), Some(MAC));
        }
        // Past the first expiry, and every later one, b's entry is fresh.
        for at in [61u64, 121] {
            let now = t0 + Duration::from_secs(at);
            assert_eq!(b.lookup(IP, now), Some(MAC));
            assert!(b.poll(now).0.is_empty(), "b asks again at {at} s");
        }
    }

    #[test]
    fn the_table_is_bounded_and_makes_room_from_expired_entries() {
        let cfg = NeighbourConfig {
            max_entries: 3,
            ..NeighbourConfig::default()
        };
        let mut c = cache(cfg);
        let t0 = Instant::now();
        let ip = |i: u8| Ipv4Addr::new(10, 0, 1, i);
        for i in 0..5 {
            c.learn(ip(i), MAC, t0);
        }
        assert_eq!(c.table().len(), 3);
        assert_eq!(c.lookup(ip(3), t0), None, "not learned: the table is full");
        // A static entry does not count and is always taken.
        c.table().add_static(ip(200), MAC);
        assert_eq!(c.lookup(ip(200), t0), Some(MAC));
        // Once the others are past use, a new address takes their place.
        let later = t0 + cfg.reachable + cfg.stale + Duration::from_millis(1);
        c.learn(ip(4), MAC, later);
        assert_eq!(c.lookup(ip(4), later), Some(MAC));
        assert_eq!(
            c.table().len(),
            2,
            "the expired three are gone, the static stays"
        );
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
