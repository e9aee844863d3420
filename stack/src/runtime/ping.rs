//! ICMP echo requests from our own stack, as `ping` sends them: one every
//! interval to one address, replies matched by identifier and sequence
//! number on whichever lcore receives them (RSS may put them anywhere).
//! The pinger wraps an lcore's app; the lcores share one `PingState`,
//! locked only when a request leaves or a reply arrives.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::counters::Counters;
use crate::host::EchoReply;
use crate::io::dpdk::DpdkIo;
use crate::io::impair::Impaired;
use crate::io::PacketIo;
use crate::runtime::LcoreApp;

/// A backend that can send echo requests and hand over echo replies.
pub trait EchoIo {
    /// False when the request could not be sent (no route, no mbuf).
    fn send_echo_request(&mut self, dst: Ipv4Addr, ident: u16, seq: u16, data_len: usize) -> bool;
    fn take_echo_replies(&mut self, out: &mut Vec<EchoReply>);
}

impl EchoIo for DpdkIo {
    fn send_echo_request(&mut self, dst: Ipv4Addr, ident: u16, seq: u16, data_len: usize) -> bool {
        DpdkIo::send_echo_request(self, dst, ident, seq, data_len, Instant::now())
    }

    fn take_echo_replies(&mut self, out: &mut Vec<EchoReply>) {
        DpdkIo::take_echo_replies(self, out)
    }
}

/// Echo requests are our own diagnostics: they bypass the impairment.
impl<P: PacketIo + EchoIo> EchoIo for Impaired<P> {
    fn send_echo_request(&mut self, dst: Ipv4Addr, ident: u16, seq: u16, data_len: usize) -> bool {
        self.inner_mut()
            .send_echo_request(dst, ident, seq, data_len)
    }

    fn take_echo_replies(&mut self, out: &mut Vec<EchoReply>) {
        self.inner_mut().take_echo_replies(out)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct PingConfig {
    pub target: Ipv4Addr,
    /// Requests to send; None: until the runtime stops.
    pub count: Option<u32>,
    pub interval: Duration,
    /// ICMP data bytes per request (ping's default: 56).
    pub data_len: usize,
}

/// One answered request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingReply {
    pub from: Ipv4Addr,
    pub seq: u16,
    pub data_len: usize,
    pub rtt: Duration,
}

/// Requests waiting for their reply; older ones are given up (lost).
const MAX_OUTSTANDING: usize = 1024;
/// Replies kept for the report (the statistics cover all of them).
const RECENT_REPLIES: usize = 64;
/// A request still unanswered this recently when the run stops is in
/// flight, not lost.
const IN_FLIGHT: Duration = Duration::from_secs(1);
/// Round trips are recorded in nanoseconds up to this (longer ones count
/// as this), to 3 significant digits.
const RTT_HISTOGRAM_MAX_NS: u64 = 60_000_000_000;

/// What the lcores share: the requests in flight and the results, in
/// bounded memory however long the ping runs.
pub struct PingState {
    config: PingConfig,
    ident: u16,
    outstanding: VecDeque<(u16, Instant)>,
    pub sent: u32,
    /// Requests the backend could not send (no route, no mbuf).
    pub unsent: u32,
    pub received: u32,
    pub rtt_min: Duration,
    pub rtt_max: Duration,
    pub rtt_sum: Duration,
    /// Every round trip, in nanoseconds, for percentiles (fixed size).
    rtt_ns: Histogram<u64>,
    /// The last replies, oldest first.
    pub recent: VecDeque<PingReply>,
    /// Replies to no request in flight (a duplicate, or one given up).
    pub unmatched: u32,
    /// When the runtime stopped (the first lcore to drain says so):
    /// requests are judged lost or in flight as of then.
    stopped_at: Option<Instant>,
}

impl PingState {
    /// `ident` tells our replies from other pings' (the process id, say).
    pub fn new(config: PingConfig, ident: u16) -> Arc<Mutex<PingState>> {
        Arc::new(Mutex::new(PingState {
            config,
            ident,
            outstanding: VecDeque::new(),
            sent: 0,
            unsent: 0,
            received: 0,
            rtt_min: Duration::MAX,
            rtt_max: Duration::ZERO,
            rtt_sum: Duration::ZERO,
            rtt_ns: Histogram::new_with_bounds(1, RTT_HISTOGRAM_MAX_NS, 3)
                .expect("valid histogram bounds"),
            recent: VecDeque::new(),
            unmatched: 0,
            stopped_at: None,
        }))
    }

    pub fn config(&self) -> &PingConfig {
        &self.config
    }

    fn done_sending(&self) -> bool {
        self.config
            .count
            .is_some_and(|c| self.sent.saturating_add(self.unsent) >= c)
    }

    /// The reply `r` answers, if it is one of ours still in flight.
    fn record(&mut self, r: &EchoReply, now: Instant) -> Option<PingReply> {
        if r.ident != self.ident || r.from != self.config.target {
            return None;
        }
        let Some(at) = self.outstanding.iter().position(|&(s, _)| s == r.seq) else {
            self.unmatched += 1;
            return None;
        };
        let (_, sent_at) = self.outstanding.remove(at).expect("found");
        let reply = PingReply {
            from: r.from,
            seq: r.seq,
            data_len: r.data_len,
            rtt: now.saturating_duration_since(sent_at),
        };
        self.received = self.received.saturating_add(1);
        self.rtt_min = self.rtt_min.min(reply.rtt);
        self.rtt_max = self.rtt_max.max(reply.rtt);
        self.rtt_sum += reply.rtt;
        let ns = u64::try_from(reply.rtt.as_nanos()).unwrap_or(u64::MAX);
        self.rtt_ns
            .saturating_record(ns.clamp(1, RTT_HISTOGRAM_MAX_NS));
        if self.recent.len() == RECENT_REPLIES {
            self.recent.pop_front();
        }
        self.recent.push_back(reply);
        Some(reply)
    }

    /// The round trip below which fraction `q` (0..=1) of them fell, to 3
    /// significant digits; None before the first reply.
    pub fn rtt_quantile(&self, q: f64) -> Option<Duration> {
        (self.received > 0).then(|| Duration::from_nanos(self.rtt_ns.value_at_quantile(q)))
    }

    /// The moment the run's results are judged at: when it stopped, or
    /// now while it runs.
    fn judged_at(&self) -> Instant {
        self.stopped_at.unwrap_or_else(Instant::now)
    }

    /// Requests sent in the last second (before the stop) and not
    /// answered yet.
    pub fn in_flight(&self) -> u32 {
        let now = self.judged_at();
        self.outstanding
            .iter()
            .filter(|(_, at)| now.saturating_duration_since(*at) < IN_FLIGHT)
            .count() as u32
    }

    /// Requests given up: neither answered nor still in flight.
    pub fn lost(&self) -> u32 {
        self.sent
            .saturating_sub(self.received)
            .saturating_sub(self.in_flight())
    }

    /// As ping's summary line says it.
    pub fn summary(&self) -> String {
        let lost = self.lost();
        let asked = self.received + lost;
        let loss = match asked {
            0 => 0.0,
            n => 100.0 * lost as f64 / n as f64,
        };
        let mut line = format!(
            "ping {}: {} sent, {} received, {:.0}% lost",
            self.config.target, self.sent, self.received, loss
        );
        if self.received > 0 {
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            let q = |q: f64| us(self.rtt_quantile(q).expect("a reply"));
            line += &format!(
                "; rtt min/avg/max {:.1}/{:.1}/{:.1} us, p50/p99/p999 {:.1}/{:.1}/{:.1} us",
                us(self.rtt_min),
                us(self.rtt_sum) / self.received as f64,
                us(self.rtt_max),
                q(0.5),
                q(0.99),
                q(0.999)
            );
        }
        line
    }
}

/// An lcore's app with the pinger around it: every lcore records the
/// replies it receives; the one made with `sends` also sends requests.
/// Each reply also goes to `replies`, if given, for a thread off the data
/// plane to print (never waited on: when it is full, the line is skipped).
pub struct Pinger<A> {
    inner: A,
    state: Option<Arc<Mutex<PingState>>>,
    sends: bool,
    next_at: Instant,
    taken: Vec<EchoReply>,
    replies: Option<SyncSender<PingReply>>,
}

impl<A> Pinger<A> {
    /// `state` None: no ping runs, `inner` alone.
    pub fn new(
        inner: A,
        state: Option<Arc<Mutex<PingState>>>,
        sends: bool,
        replies: Option<SyncSender<PingReply>>,
    ) -> Pinger<A> {
        Pinger {
            inner,
            state,
            sends,
            next_at: Instant::now(),
            taken: Vec::new(),
            replies,
        }
    }

    pub fn into_inner(self) -> A {
        self.inner
    }

    fn ping<P: EchoIo>(&mut self, io: &mut P, state: &Mutex<PingState>) -> usize {
        let mut moved = 0;
        io.take_echo_replies(&mut self.taken);
        if !self.taken.is_empty() {
            let now = Instant::now();
            let mut s = state.lock().expect("ping state");
            for r in self.taken.drain(..) {
                moved += 1;
                if let (Some(reply), Some(tx)) = (s.record(&r, now), &self.replies) {
                    let _ = tx.try_send(reply);
                }
            }
        }
        if !self.sends {
            return moved;
        }
        let now = Instant::now();
        if now < self.next_at {
            return moved;
        }
        let mut s = state.lock().expect("ping state");
        if !s.done_sending() {
            // Sequence numbers wrap at 2^16, as ping's do; at most
            // MAX_OUTSTANDING are in flight, so they stay distinct.
            let seq = s.sent.wrapping_add(s.unsent) as u16;
            let (target, ident, data_len) = (s.config.target, s.ident, s.config.data_len);
            if io.send_echo_request(target, ident, seq, data_len) {
                s.sent = s.sent.saturating_add(1);
                if s.outstanding.len() == MAX_OUTSTANDING {
                    s.outstanding.pop_front();
                }
                s.outstanding.push_back((seq, now));
            } else {
                s.unsent = s.unsent.saturating_add(1);
            }
            moved += 1;
        }
        self.next_at = now + s.config.interval;
        moved
    }
}

impl<P: PacketIo + EchoIo, A: LcoreApp<P>> LcoreApp<P> for Pinger<A> {
    fn poll(&mut self, io: &mut P) -> usize {
        let mut moved = self.inner.poll(io);
        // Taken out for the call, not cloned: no atomic on the fast path.
        if let Some(state) = self.state.take() {
            moved += self.ping(io, &state);
            self.state = Some(state);
        }
        moved
    }

    fn drain(&mut self, io: &mut P) {
        if let Some(state) = &self.state {
            let mut s = state.lock().expect("ping state");
            s.stopped_at.get_or_insert_with(Instant::now);
        }
        self.inner.drain(io);
    }

    fn counters(&self) -> Counters {
        self.inner.counters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers (or not) the requests it is asked to send.
    #[derive(Default)]
    struct Peer {
        sent: Vec<u16>,
        answer: bool,
        pending: Vec<EchoReply>,
    }

    impl EchoIo for Peer {
        fn send_echo_request(
            &mut self,
            dst: Ipv4Addr,
            ident: u16,
            seq: u16,
            data_len: usize,
        ) -> bool {
            self.sent.push(seq);
            if self.answer {
                self.pending.push(EchoReply {
                    from: dst,
                    ident,
                    seq,
                    data_len,
                });
            }
            true
        }

        fn take_echo_replies(&mut self, out: &mut Vec<EchoReply>) {
            out.append(&mut self.pending);
        }
    }

    fn config(count: Option<u32>) -> PingConfig {
        PingConfig {
            target: Ipv4Addr::new(10, 0, 0, 1),
            count,
            interval: Duration::ZERO,
            data_len: 56,
        }
    }

    #[test]
    fn replies_are_matched_counted_and_kept_in_bounded_memory() {
        let state = PingState::new(config(Some(100)), 7);
        let mut pinger = Pinger::new((), Some(state.clone()), true, None);
        let mut peer = Peer {
            answer: true,
            ..Peer::default()
        };
        for _ in 0..200 {
            pinger.ping(&mut peer, &state);
        }
        let s = state.lock().unwrap();
        assert_eq!(
            peer.sent,
            (0..100).collect::<Vec<u16>>(),
            "--ping-count stops it"
        );
        assert_eq!(
            (s.sent, s.received, s.lost(), s.unmatched),
            (100, 100, 0, 0)
        );
        assert_eq!(s.recent.len(), RECENT_REPLIES);
        assert_eq!(s.recent.back().unwrap().seq, 99);
        assert!(s.rtt_min <= s.rtt_max);
        assert!(
            s.summary().contains("100 sent, 100 received, 0% lost"),
            "{}",
            s.summary()
        );
    }

    #[test]
    fn round_trip_percentiles_come_from_every_reply() {
        let state = PingState::new(config(None), 7);
        let mut s = state.lock().unwrap();
        assert_eq!(s.rtt_quantile(0.5), None);
        let base = Instant::now();
        // Round trips of 1..=1000 us, then one of two minutes.
        for seq in 0..=1000u16 {
            s.outstanding.push_back((seq, base));
            let rtt = match seq {
                1000 => Duration::from_secs(120),
                n => Duration::from_micros(u64::from(n) + 1),
            };
            let reply = EchoReply {
                from: s.config.target,
                ident: 7,
                seq,
                data_len: 56,
            };
            assert!(s.record(&reply, base + rtt).is_some());
        }
        let us = |q: f64| s.rtt_quantile(q).unwrap().as_secs_f64() * 1e6;
        // 3 significant digits: within 0.1%.
        assert!((us(0.5) - 501.0).abs() <= 0.6, "{}", us(0.5));
        assert!((us(0.99) - 991.0).abs() <= 1.0, "{}", us(0.99));
        // The two-minute round trip counts as the histogram's top (60 s).
        assert!((us(1.0) / 6e7 - 1.0).abs() < 0.001, "{}", us(1.0));
        assert_eq!(s.rtt_max, Duration::from_secs(120));
        assert!(s.summary().contains("p50/p99/p999 50"), "{}", s.summary());
    }

    #[test]
    fn unanswered_requests_are_in_flight_for_a_second_then_lost() {
        let state = PingState::new(config(None), 7);
        let mut pinger = Pinger::new((), Some(state.clone()), true, None);
        let mut silent = Peer::default();
        for _ in 0..3 {
            pinger.ping(&mut silent, &state);
        }
        let mut s = state.lock().unwrap();
        assert_eq!((s.sent, s.in_flight(), s.lost()), (3, 3, 0));
        // Judged a second and more after they left (as at a late stop).
        s.stopped_at = Some(Instant::now() + IN_FLIGHT);
        assert_eq!((s.in_flight(), s.lost()), (0, 3));
        assert!(
            s.summary().contains("3 sent, 0 received, 100% lost"),
            "{}",
            s.summary()
        );
        // A reply to nothing in flight, or from someone else, is not ours.
        let stray = EchoReply {
            from: Ipv4Addr::new(10, 0, 0, 1),
            ident: 7,
            seq: 999,
            data_len: 56,
        };
        assert!(s.record(&stray, Instant::now()).is_none());
        assert_eq!(s.unmatched, 1);
        let other = EchoReply {
            ident: 8,
            seq: 0,
            ..stray
        };
        assert!(s.record(&other, Instant::now()).is_none());
        assert_eq!((s.unmatched, s.received), (1, 0));
    }

    #[test]
    fn sequence_numbers_wrap_and_old_requests_are_given_up() {
        let state = PingState::new(config(None), 7);
        let mut pinger = Pinger::new((), Some(state.clone()), true, None);
        let mut silent = Peer::default();
        for _ in 0..70_000 {
            pinger.ping(&mut silent, &state);
        }
        let s = state.lock().unwrap();
        assert_eq!(silent.sent[65_536], 0, "wraps at 2^16");
        assert_eq!(s.outstanding.len(), MAX_OUTSTANDING);
        assert_eq!(s.sent, 70_000);
    }
}
