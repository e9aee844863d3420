//! Seeded, deterministic link impairment: loss, duplication, reordering,
//! bit corruption, delay and jitter.
//!
//! - [`ImpairConfig`]: what to do to the traffic; parsed from a compact
//!   command-line spec such as `loss=0.05,dup=0.01,reorder=0.1,delay=2ms`.
//! - [`Impairment`]: applies a config to packets of any type `T` (a
//!   [`Packet`], a backend's [`Datagram`]), holding them in a [`DelayQueue`]
//!   until their release time.
//! - [`Impaired`]: a [`PacketIo`] wrapper that impairs what an inner backend
//!   sends, so the same impairment can be switched on over a real port.
//!
//! Determinism: an `Impairment` draws from a ChaCha8 generator seeded with
//! `ImpairConfig::seed`, and never reads the clock itself, so the same seed,
//! the same packets and the same `now` values give the same outcome.
//!
//! Reordering: a packet picked for reordering is held back until 1 to
//! [`REORDER_MAX_DEPTH`] later packets (chosen at random) have entered the
//! queue, and then leaves after the last of them. If those packets never
//! come, it leaves [`REORDER_TIMEOUT`] after its normal release time.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Datagram, PacketIo};

/// The largest `delay` or `jitter` accepted.
pub const MAX_IMPAIR_DELAY: Duration = Duration::from_secs(3600);
/// A reordered packet is overtaken by 1..=REORDER_MAX_DEPTH later packets.
pub const REORDER_MAX_DEPTH: u32 = 3;
/// A reordered packet that no later packet overtakes leaves this long after
/// its normal release time.
pub const REORDER_TIMEOUT: Duration = Duration::from_millis(1);
/// [`Impaired`] stops accepting datagrams while this many released ones wait
/// for room in the inner backend.
pub const IMPAIRED_TX_BACKLOG: usize = 4096;
/// [`Impaired`] accepts datagrams while fewer copies than this wait in its
/// delay queue: a link's queue, so that a long delay at a high rate holds
/// the sender back instead of growing without bound (16384 full-size
/// datagrams are 24 MB; at a 10 ms delay that is 1.6 M datagrams/s).
pub const IMPAIRED_MAX_DELAYED: usize = 16384;

/// What an [`Impairment`] does to traffic. `Default` is a perfect link.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ImpairConfig {
    /// Probability, 0..=1, that a packet is dropped.
    pub loss: f64,
    /// Probability that a packet (not dropped) is sent twice.
    pub duplicate: f64,
    /// Probability that a copy is held back and released after the next
    /// packet(s); see the module docs.
    pub reorder: f64,
    /// Probability that one random bit of a copy's payload is flipped.
    pub corrupt: f64,
    /// Fixed delay added to every copy.
    pub delay: Duration,
    /// Uniform extra delay in `0..=jitter`, drawn per copy.
    pub jitter: Duration,
    /// Seed of the ChaCha8 generator.
    pub seed: u64,
}

impl ImpairConfig {
    /// True when the config changes nothing (the seed aside).
    pub fn is_perfect(&self) -> bool {
        self.loss == 0.0
            && self.duplicate == 0.0
            && self.reorder == 0.0
            && self.corrupt == 0.0
            && self.delay.is_zero()
            && self.jitter.is_zero()
    }

    /// Probabilities finite and in `[0, 1]`; delays at most
    /// [`MAX_IMPAIR_DELAY`].
    pub fn validate(&self) -> Result<(), String> {
        for (name, p) in [
            ("loss", self.loss),
            ("dup", self.duplicate),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
        ] {
            if !p.is_finite() || !(0.0..=1.0).contains(&p) {
                return Err(format!("{name}={p}: probability must be in [0, 1]"));
            }
        }
        for (name, d) in [("delay", self.delay), ("jitter", self.jitter)] {
            if d > MAX_IMPAIR_DELAY {
                return Err(format!(
                    "{name}={d:?}: must be at most {}s",
                    MAX_IMPAIR_DELAY.as_secs()
                ));
            }
        }
        Ok(())
    }
}

/// The keys [`ImpairConfig::from_str`] accepts.
const KEYS: &str = "loss, dup, reorder, corrupt, delay, jitter, seed";

fn parse_probability(key: &str, value: &str) -> Result<f64, String> {
    let (num, scale) = match value.strip_suffix('%') {
        Some(n) => (n.trim(), 100.0),
        None => (value, 1.0),
    };
    let p = num
        .parse::<f64>()
        .map_err(|_| {
            format!("{key}=`{value}`: not a probability (expected a number in [0, 1] or a percentage, e.g. 0.05 or 5%)")
        })?
        / scale;
    if !p.is_finite() || !(0.0..=1.0).contains(&p) {
        return Err(format!("{key}=`{value}`: probability must be in [0, 1]"));
    }
    Ok(p)
}

fn parse_duration(key: &str, value: &str) -> Result<Duration, String> {
    // Longest suffixes first: "ms" and "us" also end in "s".
    let units: [(&str, u64); 4] = [
        ("ms", 1_000_000),
        ("us", 1_000),
        ("µs", 1_000),
        ("s", 1_000_000_000),
    ];
    let Some((num, nanos_per_unit)) = units
        .iter()
        .find_map(|&(u, n)| value.strip_suffix(u).map(|num| (num.trim(), n)))
    else {
        if value.parse::<f64>() == Ok(0.0) {
            return Ok(Duration::ZERO);
        }
        return Err(format!(
            "{key}=`{value}`: a duration needs a unit: us, ms or s (e.g. 2ms)"
        ));
    };
    let d = if let Ok(n) = num.parse::<u64>() {
        n.checked_mul(nanos_per_unit).map(Duration::from_nanos)
    } else {
        match num.parse::<f64>() {
            Ok(x) if x.is_finite() && x >= 0.0 => {
                let secs = x * nanos_per_unit as f64 / 1e9;
                (secs <= MAX_IMPAIR_DELAY.as_secs_f64()).then(|| Duration::from_secs_f64(secs))
            }
            Ok(_) => return Err(format!("{key}=`{value}`: must be a non-negative duration")),
            Err(_) => {
                return Err(format!(
                    "{key}=`{value}`: not a duration (expected a number and a unit: us, ms or s)"
                ))
            }
        }
    };
    match d {
        Some(d) if d <= MAX_IMPAIR_DELAY => Ok(d),
        _ => Err(format!(
            "{key}=`{value}`: must be at most {}s",
            MAX_IMPAIR_DELAY.as_secs()
        )),
    }
}

impl FromStr for ImpairConfig {
    type Err = String;

    /// Parses `key=value` pairs separated by commas, e.g.
    /// `loss=0.05,dup=0.01,reorder=0.1,corrupt=0.001,delay=2ms,jitter=1ms,seed=7`.
    /// Keys: `loss`, `dup` (or `duplicate`), `reorder`, `corrupt`, `delay`,
    /// `jitter`, `seed`; each at most once, missing ones are 0. Probabilities
    /// are numbers in [0, 1] or percentages (`5%`); durations need a unit
    /// (`us`, `ms`, `s`) unless 0. An empty spec, `none`, `off` or `perfect`
    /// is a perfect link.
    fn from_str(spec: &str) -> Result<Self, String> {
        let spec = spec.trim();
        let mut cfg = ImpairConfig::default();
        if spec.is_empty() || ["none", "off", "perfect"].contains(&spec) {
            return Ok(cfg);
        }
        let mut seen: Vec<&str> = Vec::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(format!("`{item}`: expected key=value (keys: {KEYS})"));
            };
            let (key, value) = (key.trim(), value.trim());
            let canonical = match key {
                "duplicate" => "dup",
                k => k,
            };
            if seen.contains(&canonical) {
                return Err(format!("`{key}` given more than once"));
            }
            match canonical {
                "loss" => cfg.loss = parse_probability(key, value)?,
                "dup" => cfg.duplicate = parse_probability(key, value)?,
                "reorder" => cfg.reorder = parse_probability(key, value)?,
                "corrupt" => cfg.corrupt = parse_probability(key, value)?,
                "delay" => cfg.delay = parse_duration(key, value)?,
                "jitter" => cfg.jitter = parse_duration(key, value)?,
                "seed" => {
                    cfg.seed = value
                        .parse()
                        .map_err(|_| format!("{key}=`{value}`: not an unsigned 64-bit integer"))?
                }
                _ => return Err(format!("unknown key `{key}` (keys: {KEYS})")),
            }
            seen.push(canonical);
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

fn fmt_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else if ns.is_multiple_of(1_000) {
        format!("{}us", ns / 1_000)
    } else {
        format!("{}us", ns as f64 / 1e3)
    }
}

impl fmt::Display for ImpairConfig {
    /// The spec [`FromStr`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loss={},dup={},reorder={},corrupt={},delay={},jitter={},seed={}",
            self.loss,
            self.duplicate,
            self.reorder,
            self.corrupt,
            fmt_duration(self.delay),
            fmt_duration(self.jitter),
            self.seed
        )
    }
}

/// Counters of an [`Impairment`]. `offered = dropped + (copies queued) -
/// duplicated`; `delivered` counts copies released from the delay queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImpairStats {
    /// Packets handed to `offer`.
    pub offered: u64,
    /// Packets dropped (loss).
    pub dropped: u64,
    /// Packets sent twice.
    pub duplicated: u64,
    /// Copies held back for reordering that left after a later copy (one
    /// that nothing overtook before its timeout left in order).
    pub reordered: u64,
    /// Copies with one bit flipped.
    pub corrupted: u64,
    /// Copies released from the delay queue.
    pub delivered: u64,
    /// Duplicates not made because no buffer could be had for the copy.
    pub dup_failed: u64,
}

/// The bytes an [`Impairment`] may corrupt.
pub trait ImpairPayload {
    fn impair_bytes(&mut self) -> &mut [u8];
}

impl<D: Datagram> ImpairPayload for D {
    fn impair_bytes(&mut self) -> &mut [u8] {
        self.payload_mut()
    }
}

/// A payload with metadata, for using an [`Impairment`] outside `PacketIo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<M> {
    pub payload: Vec<u8>,
    pub meta: M,
}

impl<M> ImpairPayload for Packet<M> {
    fn impair_bytes(&mut self) -> &mut [u8] {
        &mut self.payload
    }
}

/// The fate of one copy of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyFate {
    /// `now + delay + jitter`; a held copy leaves later (see `held_for`).
    pub release: Instant,
    /// The payload bit flipped (byte `bit / 8`, bit `bit % 8`), if any.
    pub corrupted_bit: Option<usize>,
    /// Held back until this many later copies have been queued.
    pub held_for: Option<u32>,
}

/// What [`Impairment::offer`] did with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Dropped,
    Queued {
        first: CopyFate,
        /// The duplicate, if one was made.
        second: Option<CopyFate>,
    },
}

struct Entry<T> {
    release: Instant,
    seq: u64,
    /// When the item came (its place in the order items were offered): a
    /// held item keeps its place while it waits.
    order: u64,
    held: bool,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.release, self.seq) == (other.release, other.seq)
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.release, self.seq).cmp(&(other.release, other.seq))
    }
}

struct HeldEntry<T> {
    release: Instant,
    deadline: Instant,
    remaining: u32,
    order: u64,
    item: T,
}

/// Items waiting for their release time, ordered by (release time, order of
/// insertion): items due at the same time leave in the order they came.
/// Also holds reordered items until enough later items have overtaken them.
pub struct DelayQueue<T> {
    heap: BinaryHeap<Reverse<Entry<T>>>,
    held: Vec<HeldEntry<T>>,
    seq: u64,
    /// The latest-offered item that has left, by `Entry::order`.
    latest_left: Option<u64>,
    /// Held items that left after an item offered later than them.
    overtaken: u64,
}

impl<T> Default for DelayQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> DelayQueue<T> {
    pub fn new() -> Self {
        DelayQueue {
            heap: BinaryHeap::new(),
            held: Vec::new(),
            seq: 0,
            latest_left: None,
            overtaken: 0,
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq - 1
    }

    fn insert(&mut self, release: Instant, order: u64, held: bool, item: T) {
        let seq = self.next_seq();
        self.heap.push(Reverse(Entry {
            release,
            seq,
            order,
            held,
            item,
        }));
    }

    /// Queue `item` to leave at `release`. It overtakes held items: each
    /// counts it, and one whose count is reached is queued right behind it.
    pub fn push(&mut self, release: Instant, item: T) {
        let order = self.seq;
        self.insert(release, order, false, item);
        let mut i = 0;
        while i < self.held.len() {
            self.held[i].remaining -= 1;
            if self.held[i].remaining == 0 {
                let h = self.held.remove(i);
                self.insert(h.release.max(release), h.order, true, h.item);
            } else {
                i += 1;
            }
        }
    }

    /// Hold `item` back until `overtakers` (at least 1) later items have been
    /// pushed, or until `release + REORDER_TIMEOUT`.
    pub fn push_held(&mut self, release: Instant, overtakers: u32, item: T) {
        let order = self.next_seq();
        self.held.push(HeldEntry {
            release,
            deadline: release + REORDER_TIMEOUT,
            remaining: overtakers.max(1),
            order,
            item,
        });
    }

    /// Move every item due at `now` to `out`, in release order; returns how
    /// many.
    pub fn release(&mut self, now: Instant, out: &mut Vec<T>) -> usize {
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].deadline <= now {
                let h = self.held.remove(i);
                self.insert(h.deadline, h.order, true, h.item);
            } else {
                i += 1;
            }
        }
        let mut n = 0;
        while self.heap.peek().is_some_and(|e| e.0.release <= now) {
            if let Some(Reverse(e)) = self.heap.pop() {
                if e.held && self.latest_left.is_some_and(|o| o > e.order) {
                    self.overtaken += 1;
                }
                self.latest_left = self.latest_left.max(Some(e.order));
                out.push(e.item);
                n += 1;
            }
        }
        n
    }

    /// The earliest time an item can leave, if any is queued.
    pub fn next_release(&self) -> Option<Instant> {
        let heap = self.heap.peek().map(|e| e.0.release);
        let held = self.held.iter().map(|h| h.deadline).min();
        match (heap, held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len() + self.held.len()
    }

    /// Held items that left after an item that came later than them: the
    /// reorderings that happened (a held item nothing overtook before its
    /// timeout left in its place).
    pub fn overtaken(&self) -> u64 {
        self.overtaken
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Applies an [`ImpairConfig`] to packets of type `T` and holds them until
/// they are due. See the module docs for determinism and reordering.
pub struct Impairment<T> {
    config: ImpairConfig,
    rng: ChaCha8Rng,
    queue: DelayQueue<T>,
    stats: ImpairStats,
}

impl<T: ImpairPayload> Impairment<T> {
    /// Fails if the config does not validate.
    pub fn new(config: ImpairConfig) -> Result<Self, String> {
        config.validate()?;
        Ok(Impairment {
            config,
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            queue: DelayQueue::new(),
            stats: ImpairStats::default(),
        })
    }

    pub fn config(&self) -> &ImpairConfig {
        &self.config
    }

    pub fn stats(&self) -> ImpairStats {
        self.stats
    }

    /// Copies waiting in the delay queue.
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// The earliest time [`release`](Self::release) can return something.
    pub fn next_release(&self) -> Option<Instant> {
        self.queue.next_release()
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.gen::<f64>() < p
    }

    fn copy_fate(&mut self, len: usize, now: Instant) -> CopyFate {
        let jitter = match self.config.jitter.as_nanos() as u64 {
            0 => Duration::ZERO,
            j => Duration::from_nanos(self.rng.gen_range(0..=j)),
        };
        let corrupted_bit = if self.chance(self.config.corrupt) && len > 0 {
            Some(self.rng.gen_range(0..len * 8))
        } else {
            None
        };
        let held_for = if self.chance(self.config.reorder) {
            Some(self.rng.gen_range(1..=REORDER_MAX_DEPTH))
        } else {
            None
        };
        CopyFate {
            release: now + self.config.delay + jitter,
            corrupted_bit,
            held_for,
        }
    }

    fn enqueue(&mut self, mut pkt: T, fate: CopyFate) {
        if let Some(bit) = fate.corrupted_bit {
            if let Some(byte) = pkt.impair_bytes().get_mut(bit / 8) {
                *byte ^= 1 << (bit % 8);
                self.stats.corrupted += 1;
            }
        }
        match fate.held_for {
            Some(n) => self.queue.push_held(fate.release, n, pkt),
            None => self.queue.push(fate.release, pkt),
        }
    }

    /// Decide the fate of one packet offered at `now` and queue its copies.
    /// `dup` makes the duplicate when one is wanted (called before any
    /// corruption); `None` from it (no buffer) means no duplicate, counted in
    /// `dup_failed`.
    pub fn offer(
        &mut self,
        mut pkt: T,
        now: Instant,
        dup: impl FnOnce(&T) -> Option<T>,
    ) -> Verdict {
        self.stats.offered += 1;
        if self.chance(self.config.loss) {
            self.stats.dropped += 1;
            return Verdict::Dropped;
        }
        let duplicate = self.chance(self.config.duplicate);
        let len = pkt.impair_bytes().len();
        let first = self.copy_fate(len, now);
        let mut second = None;
        if duplicate {
            // Draw the duplicate's fate even if the copy fails, so that the
            // random stream does not depend on buffer availability.
            let fate = self.copy_fate(len, now);
            match dup(&pkt) {
                Some(copy) => {
                    self.stats.duplicated += 1;
                    second = Some((fate, copy));
                }
                None => self.stats.dup_failed += 1,
            }
        }
        self.enqueue(pkt, first);
        let second = second.map(|(fate, copy)| {
            self.enqueue(copy, fate);
            fate
        });
        Verdict::Queued { first, second }
    }

    /// Move every copy due at `now` to `out`; returns how many.
    pub fn release(&mut self, now: Instant, out: &mut Vec<T>) -> usize {
        let n = self.queue.release(now, out);
        self.stats.delivered += n as u64;
        self.stats.reordered = self.queue.overtaken();
        n
    }
}

impl<M: Clone> Impairment<Packet<M>> {
    /// [`offer`](Self::offer), duplicating by `clone`.
    pub fn offer_packet(&mut self, pkt: Packet<M>, now: Instant) -> Verdict {
        self.offer(pkt, now, |p| Some(p.clone()))
    }
}

/// A [`PacketIo`] that impairs what `P` sends; receiving is untouched.
///
/// Sent buffers are held in the delay queue as they are (no copy); a
/// duplicate is made with `inner.alloc()` and a copy. The time used for
/// `send_burst` is the `now` of the latest `poll` (or of `new`): copies due
/// then go to the inner backend at once, later ones on the `poll` at or after
/// their release time. Released copies the inner backend has no room for wait
/// and are retried on the next call; while [`IMPAIRED_TX_BACKLOG`] wait,
/// `send_burst` accepts nothing, and it accepts no more datagrams than the
/// delay queue has room for below [`IMPAIRED_MAX_DELAYED`].
pub struct Impaired<P: PacketIo> {
    inner: P,
    impair: Impairment<P::Buf>,
    now: Instant,
    tx: Vec<P::Buf>,
}

impl<P: PacketIo> Impaired<P> {
    /// Fails if the config does not validate.
    pub fn new(inner: P, config: ImpairConfig) -> Result<Self, String> {
        Ok(Impaired {
            inner,
            impair: Impairment::new(config)?,
            now: Instant::now(),
            tx: Vec::new(),
        })
    }

    pub fn inner(&self) -> &P {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut P {
        &mut self.inner
    }

    /// The inner backend; copies still queued are dropped.
    pub fn into_inner(self) -> P {
        self.inner
    }

    pub fn stats(&self) -> ImpairStats {
        self.impair.stats()
    }

    /// Copies in the delay queue plus released ones waiting for the inner
    /// backend.
    pub fn pending(&self) -> usize {
        self.impair.pending() + self.tx.len()
    }

    fn flush(&mut self) {
        self.impair.release(self.now, &mut self.tx);
        if !self.tx.is_empty() {
            self.inner.send_burst(&mut self.tx);
        }
    }
}

impl<P: PacketIo> PacketIo for Impaired<P> {
    type Buf = P::Buf;

    fn recv_burst(&mut self, out: &mut Vec<P::Buf>, max: usize) -> usize {
        self.inner.recv_burst(out, max)
    }

    fn alloc(&mut self) -> Option<P::Buf> {
        self.inner.alloc()
    }

    fn release(&mut self, buf: P::Buf) {
        self.inner.release(buf)
    }

    fn send_burst(&mut self, bufs: &mut Vec<P::Buf>) -> usize {
        if self.tx.len() >= IMPAIRED_TX_BACKLOG {
            self.flush();
            if self.tx.len() >= IMPAIRED_TX_BACKLOG {
                return 0;
            }
        }
        let room = IMPAIRED_MAX_DELAYED.saturating_sub(self.impair.pending());
        let n = bufs.len().min(room);
        let inner = &mut self.inner;
        for buf in bufs.drain(..n) {
            self.impair.offer(buf, self.now, |b| {
                let mut copy = inner.alloc()?;
                let len = b.payload().len();
                if copy.capacity() < len {
                    return None;
                }
                copy.set_len(len);
                copy.payload_mut().copy_from_slice(b.payload());
                copy.set_peer(b.peer());
                copy.set_local_port(b.local_port());
                Some(copy)
            });
        }
        self.flush();
        n
    }

    fn poll(&mut self, now: Instant) {
        self.now = now;
        self.inner.poll(now);
        self.flush();
    }

    fn local_ip(&self) -> std::net::Ipv4Addr {
        self.inner.local_ip()
    }

    fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }

    fn max_payload_to(&self, peer: std::net::SocketAddrV4) -> usize {
        self.inner.max_payload_to(peer)
    }
}

impl<P: super::CountedIo> super::CountedIo for Impaired<P> {
    fn counters(&self) -> crate::counters::Counters {
        let mut c = self.inner.counters();
        let s = self.stats();
        c.drops[crate::counters::DropReason::Impaired as usize] += s.dropped;
        c.impair_duplicated += s.duplicated;
        c.impair_reordered += s.reordered;
        c.impair_corrupted += s.corrupted;
        c
    }

    fn frames_moved(&self) -> u64 {
        self.inner.frames_moved()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Instant {
        Instant::now()
    }

    fn pkt(i: u32) -> Packet<u32> {
        Packet {
            payload: i.to_be_bytes().repeat(4),
            meta: i,
        }
    }

    /// A backend whose route to one peer is narrower than its port.
    struct NarrowTo(std::net::SocketAddrV4);

    impl PacketIo for NarrowTo {
        type Buf = crate::io::heap::HeapDatagram;
        fn recv_burst(&mut self, _: &mut Vec<Self::Buf>, _: usize) -> usize {
            0
        }
        fn alloc(&mut self) -> Option<Self::Buf> {
            Some(crate::io::heap::HeapDatagram::new(1472))
        }
        fn send_burst(&mut self, bufs: &mut Vec<Self::Buf>) -> usize {
            let n = bufs.len();
            bufs.clear();
            n
        }
        fn poll(&mut self, _: Instant) {}
        fn local_ip(&self) -> std::net::Ipv4Addr {
            std::net::Ipv4Addr::LOCALHOST
        }
        fn max_payload(&self) -> usize {
            1472
        }
        fn max_payload_to(&self, peer: std::net::SocketAddrV4) -> usize {
            if peer == self.0 {
                1200
            } else {
                1472
            }
        }
    }

    /// With a long delay the queue fills to its bound and the sender is
    /// held back (datagrams stay with it) until copies leave.
    #[test]
    fn a_full_delay_queue_holds_the_sender_back() {
        let peer: std::net::SocketAddrV4 = "10.0.0.9:4433".parse().unwrap();
        let delay = Duration::from_secs(1);
        let cfg = ImpairConfig {
            delay,
            ..Default::default()
        };
        let mut io = Impaired::new(NarrowTo(peer), cfg).unwrap();
        let start = Instant::now();
        io.poll(start);
        let mut accepted = 0;
        for _ in 0..(IMPAIRED_MAX_DELAYED / 1000 + 2) {
            let mut bufs: Vec<_> = (0..1000).map(|_| io.alloc().unwrap()).collect();
            let took = io.send_burst(&mut bufs);
            assert_eq!(
                bufs.len(),
                1000 - took,
                "refused datagrams stay with the caller"
            );
            accepted += took;
        }
        assert_eq!(
            (accepted, io.pending()),
            (IMPAIRED_MAX_DELAYED, IMPAIRED_MAX_DELAYED)
        );
        io.poll(start + delay);
        assert_eq!(io.pending(), 0, "all left after the delay");
        let mut bufs: Vec<_> = (0..10).map(|_| io.alloc().unwrap()).collect();
        assert_eq!(io.send_burst(&mut bufs), 10);
    }

    /// The wrapper passes on the inner backend's route sizes: with the
    /// default it reported the port's size for every peer, and a QUIC
    /// connection to a narrow route sent datagrams that never got there.
    #[test]
    fn the_route_size_is_the_inner_backends() {
        let narrow: std::net::SocketAddrV4 = "10.0.0.9:4433".parse().unwrap();
        let io = Impaired::new(NarrowTo(narrow), ImpairConfig::default()).unwrap();
        assert_eq!(io.max_payload_to(narrow), 1200);
        assert_eq!(io.max_payload_to("10.0.0.8:4433".parse().unwrap()), 1472);
    }

    #[test]
    fn parse_full_spec() {
        let c: ImpairConfig =
            "loss=0.05,dup=0.01,reorder=0.1,corrupt=0.001,delay=2ms,jitter=1ms,seed=7"
                .parse()
                .unwrap();
        assert_eq!(
            c,
            ImpairConfig {
                loss: 0.05,
                duplicate: 0.01,
                reorder: 0.1,
                corrupt: 0.001,
                delay: Duration::from_millis(2),
                jitter: Duration::from_millis(1),
                seed: 7,
            }
        );
    }

    #[test]
    fn parse_units_percent_and_aliases() {
        let c: ImpairConfig = " duplicate = 5% , delay=250us, jitter=1.5ms ,loss=0, "
            .parse()
            .unwrap();
        assert_eq!(c.duplicate, 0.05);
        assert_eq!(c.delay, Duration::from_micros(250));
        assert_eq!(c.jitter, Duration::from_micros(1500));
        assert_eq!(
            "delay=1s".parse::<ImpairConfig>().unwrap().delay,
            Duration::from_secs(1)
        );
        assert_eq!(
            "delay=0".parse::<ImpairConfig>().unwrap().delay,
            Duration::ZERO
        );
        for perfect in ["", "none", "off", "perfect"] {
            assert!(perfect.parse::<ImpairConfig>().unwrap().is_perfect());
        }
    }

    #[test]
    fn display_round_trips() {
        let c: ImpairConfig =
            "loss=0.25,dup=0.125,reorder=0.5,corrupt=1,delay=3ms,jitter=7us,seed=99"
                .parse()
                .unwrap();
        assert_eq!(c.to_string().parse::<ImpairConfig>().unwrap(), c);
    }

    #[test]
    fn parse_errors_name_key_and_value() {
        let cases = [
            ("loss=1.5", "loss"),
            ("loss=abc", "abc"),
            ("dup=-0.1", "dup"),
            ("reorder=NaN", "reorder"),
            ("delay=5", "unit"),
            ("delay=5m", "delay"),
            ("jitter=-1ms", "jitter"),
            ("delay=2h", "2h"),
            ("delay=7200s", "at most"),
            ("seed=-3", "seed"),
            ("bogus=1", "bogus"),
            ("loss", "key=value"),
            ("loss=0.1,loss=0.2", "more than once"),
        ];
        for (spec, needle) in cases {
            let err = spec.parse::<ImpairConfig>().unwrap_err();
            assert!(
                err.contains(needle),
                "{spec}: error `{err}` lacks `{needle}`"
            );
        }
    }

    #[test]
    fn validate_rejects_bad_values() {
        assert!(ImpairConfig::default().validate().is_ok());
        let bad = [
            ImpairConfig {
                loss: f64::NAN,
                ..Default::default()
            },
            ImpairConfig {
                corrupt: 1.01,
                ..Default::default()
            },
            ImpairConfig {
                reorder: -0.0001,
                ..Default::default()
            },
            ImpairConfig {
                jitter: Duration::from_secs(3601),
                ..Default::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
            assert!(Impairment::<Packet<()>>::new(c).is_err());
        }
    }

    #[test]
    fn delay_queue_orders_by_time_then_insertion() {
        let t = t0();
        let mut q = DelayQueue::new();
        q.push(t + Duration::from_micros(5), "c");
        q.push(t, "a");
        q.push(t, "b");
        q.push(t + Duration::from_micros(9), "d");
        let mut out = Vec::new();
        assert_eq!(q.release(t, &mut out), 2);
        assert_eq!(out, ["a", "b"]);
        assert_eq!(q.next_release(), Some(t + Duration::from_micros(5)));
        assert_eq!(q.release(t + Duration::from_micros(9), &mut out), 2);
        assert_eq!(out, ["a", "b", "c", "d"]);
        assert!(q.is_empty());
    }

    #[test]
    fn delay_queue_held_item_leaves_after_overtakers_or_timeout() {
        let t = t0();
        let mut q = DelayQueue::new();
        q.push_held(t, 2, 0);
        q.push(t, 1);
        q.push(t, 2);
        q.push(t, 3);
        q.push_held(t, 3, 4);
        let mut out = Vec::new();
        q.release(t, &mut out);
        assert_eq!(out, [1, 2, 0, 3]);
        assert_eq!(q.len(), 1);
        q.release(t + REORDER_TIMEOUT - Duration::from_nanos(1), &mut out);
        assert_eq!(out.len(), 4);
        q.release(t + REORDER_TIMEOUT, &mut out);
        assert_eq!(out, [1, 2, 0, 3, 4]);
        // 0 left behind two later items; 4 timed out with nothing behind it.
        assert_eq!(q.overtaken(), 1);
    }

    /// A held item counts as reordered only when a later one left first:
    /// one that times out before anything later comes left in its place.
    #[test]
    fn only_held_items_that_something_overtook_count_as_reordered() {
        let t = t0();
        let mut q = DelayQueue::new();
        let mut out = Vec::new();
        q.push_held(t, 1, "alone");
        q.release(t + REORDER_TIMEOUT, &mut out);
        q.push(t + REORDER_TIMEOUT, "next");
        q.release(t + REORDER_TIMEOUT, &mut out);
        assert_eq!(out, ["alone", "next"]);
        assert_eq!(q.overtaken(), 0);
        // Overtaken by an item due later than its own timeout: it waits
        // for it, and leaves behind it.
        let late = t + REORDER_TIMEOUT * 10;
        q.push_held(t, 1, "held");
        q.push(late, "later");
        q.release(late, &mut out);
        assert_eq!(out[2..], ["later", "held"]);
        assert_eq!(q.overtaken(), 1);
    }

    #[test]
    fn perfect_impairment_passes_everything_in_order() {
        let t = t0();
        let mut imp = Impairment::new(ImpairConfig::default()).unwrap();
        for i in 0..1000 {
            assert!(matches!(
                imp.offer_packet(pkt(i), t),
                Verdict::Queued { second: None, .. }
            ));
        }
        let mut out = Vec::new();
        assert_eq!(imp.release(t, &mut out), 1000);
        assert!(out.iter().enumerate().all(|(i, p)| *p == pkt(i as u32)));
        let s = imp.stats();
        assert_eq!((s.offered, s.delivered, s.dropped), (1000, 1000, 0));
    }

    #[test]
    fn loss_rate_matches() {
        let t = t0();
        let cfg = ImpairConfig {
            loss: 0.1,
            seed: 1,
            ..Default::default()
        };
        let mut imp = Impairment::new(cfg).unwrap();
        for i in 0..100_000 {
            imp.offer_packet(pkt(i), t);
        }
        let mut out = Vec::new();
        imp.release(t, &mut out);
        let dropped = imp.stats().dropped;
        assert!((9_000..=11_000).contains(&dropped), "dropped {dropped}");
        assert_eq!(out.len() as u64 + dropped, 100_000);
    }

    #[test]
    fn delay_and_jitter_bound_release_times() {
        let t = t0();
        let cfg = ImpairConfig {
            delay: Duration::from_millis(2),
            jitter: Duration::from_millis(1),
            seed: 3,
            ..Default::default()
        };
        let mut imp = Impairment::new(cfg).unwrap();
        let mut spread = false;
        for i in 0..1000 {
            let Verdict::Queued { first, .. } = imp.offer_packet(pkt(i), t) else {
                panic!("dropped on a lossless link");
            };
            let extra = first.release - t;
            assert!(extra >= cfg.delay && extra <= cfg.delay + cfg.jitter);
            spread |= extra > cfg.delay + Duration::from_micros(500);
        }
        assert!(spread);
        let mut out = Vec::new();
        assert_eq!(imp.release(t + Duration::from_micros(1999), &mut out), 0);
        assert_eq!(imp.release(t + Duration::from_millis(3), &mut out), 1000);
    }

    #[test]
    fn corruption_flips_exactly_the_reported_bit() {
        let t = t0();
        let cfg = ImpairConfig {
            corrupt: 0.5,
            seed: 11,
            ..Default::default()
        };
        let mut imp = Impairment::new(cfg).unwrap();
        let mut bits = Vec::new();
        for i in 0..1000 {
            match imp.offer_packet(pkt(i), t) {
                Verdict::Queued { first, .. } => bits.push(first.corrupted_bit),
                Verdict::Dropped => unreachable!(),
            }
        }
        let mut out = Vec::new();
        imp.release(t, &mut out);
        for (p, bit) in out.iter().zip(&bits) {
            let mut want = pkt(p.meta).payload;
            if let Some(b) = bit {
                want[b / 8] ^= 1 << (b % 8);
            }
            assert_eq!(p.payload, want);
        }
        let n = bits.iter().filter(|b| b.is_some()).count() as u64;
        assert_eq!(imp.stats().corrupted, n);
        assert!((400..=600).contains(&n), "corrupted {n}");
    }

    #[test]
    fn empty_payload_is_never_corrupted() {
        let t = t0();
        let cfg = ImpairConfig {
            corrupt: 1.0,
            ..Default::default()
        };
        let mut imp = Impairment::new(cfg).unwrap();
        imp.offer_packet(
            Packet {
                payload: vec![],
                meta: (),
            },
            t,
        );
        assert_eq!(imp.stats().corrupted, 0);
    }

    #[test]
    fn failed_duplicate_is_counted() {
        let t = t0();
        let cfg = ImpairConfig {
            duplicate: 1.0,
            ..Default::default()
        };
        let mut imp = Impairment::new(cfg).unwrap();
        let v = imp.offer(pkt(1), t, |_| None);
        assert!(matches!(v, Verdict::Queued { second: None, .. }));
        let s = imp.stats();
        assert_eq!((s.duplicated, s.dup_failed, imp.pending()), (0, 1, 1));
    }

    #[test]
    fn same_seed_same_outcome() {
        let run = |seed: u64| {
            let t = t0();
            let cfg = ImpairConfig {
                loss: 0.1,
                duplicate: 0.1,
                reorder: 0.1,
                corrupt: 0.1,
                delay: Duration::from_micros(100),
                jitter: Duration::from_micros(100),
                seed,
            };
            let mut imp = Impairment::new(cfg).unwrap();
            let mut out = Vec::new();
            let mut verdicts = Vec::new();
            for i in 0..5000u32 {
                let now = t + Duration::from_micros(u64::from(i));
                let v = imp.offer_packet(pkt(i), now);
                verdicts.push(v.clone_relative(t));
                imp.release(now, &mut out);
            }
            imp.release(t + Duration::from_secs(1), &mut out);
            (out, verdicts, imp.stats())
        };
        let a = run(42);
        assert_eq!(a, run(42));
        assert_ne!(a.0, run(43).0);
    }

    type RelFate = (Duration, Option<usize>, Option<u32>);

    impl Verdict {
        /// Release times relative to `t`, for comparing runs.
        fn clone_relative(&self, t: Instant) -> Option<[Option<RelFate>; 2]> {
            let rel = |f: &CopyFate| (f.release - t, f.corrupted_bit, f.held_for);
            match self {
                Verdict::Dropped => None,
                Verdict::Queued { first, second } => {
                    Some([Some(rel(first)), second.as_ref().map(rel)])
                }
            }
        }
    }
}
