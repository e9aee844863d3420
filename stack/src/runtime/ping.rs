//! ICMP echo requests from our own stack, as `ping` sends them: one every
//! interval to one address, replies matched by identifier and sequence
//! number on whichever lcore receives them (RSS may put them anywhere).
//! The pinger wraps an lcore's app; the lcores share one `PingState`,
//! locked only when a request leaves or a reply arrives.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Sees each reply as it arrives (ainftp-dp prints it).
pub type OnReply = Box<dyn Fn(&PingReply) + Send>;

/// Requests waiting for their reply; older ones are given up (lost).
const MAX_OUTSTANDING: usize = 1024;

/// What the lcores share: the requests in flight and the results.
pub struct PingState {
    config: PingConfig,
    ident: u16,
    outstanding: VecDeque<(u16, Instant)>,
    pub sent: u32,
    /// Requests the backend could not send (no route, no mbuf).
    pub unsent: u32,
    pub replies: Vec<PingReply>,
    /// Replies to no request in flight (a duplicate, or one given up).
    pub unmatched: u32,
    on_reply: Option<OnReply>,
}

impl PingState {
    /// `ident` tells our replies from other pings' (the process id, say);
    /// `on_reply` sees each reply as it arrives (to print it).
    pub fn new(config: PingConfig, ident: u16, on_reply: Option<OnReply>) -> Arc<Mutex<PingState>> {
        Arc::new(Mutex::new(PingState {
            config,
            ident,
            outstanding: VecDeque::new(),
            sent: 0,
            unsent: 0,
            replies: Vec::new(),
            unmatched: 0,
            on_reply,
        }))
    }

    pub fn config(&self) -> &PingConfig {
        &self.config
    }

    fn done_sending(&self) -> bool {
        self.config
            .count
            .is_some_and(|c| self.sent + self.unsent >= c)
    }

    fn record(&mut self, r: &EchoReply, now: Instant) {
        if r.ident != self.ident || r.from != self.config.target {
            return;
        }
        let Some(at) = self.outstanding.iter().position(|&(s, _)| s == r.seq) else {
            self.unmatched += 1;
            return;
        };
        let (_, sent_at) = self.outstanding.remove(at).expect("found");
        let reply = PingReply {
            from: r.from,
            seq: r.seq,
            data_len: r.data_len,
            rtt: now.saturating_duration_since(sent_at),
        };
        if let Some(f) = &self.on_reply {
            f(&reply);
        }
        self.replies.push(reply);
    }

    /// Replies received over requests sent, as ping's summary line says it.
    pub fn summary(&self) -> String {
        let lost = self.sent.saturating_sub(self.replies.len() as u32);
        let loss = match self.sent {
            0 => 0.0,
            n => 100.0 * lost as f64 / n as f64,
        };
        let mut line = format!(
            "ping {}: {} sent, {} received, {:.0}% lost",
            self.config.target,
            self.sent,
            self.replies.len(),
            loss
        );
        let us: Vec<f64> = self
            .replies
            .iter()
            .map(|r| r.rtt.as_secs_f64() * 1e6)
            .collect();
        if !us.is_empty() {
            let min = us.iter().copied().fold(f64::INFINITY, f64::min);
            let max = us.iter().copied().fold(0.0, f64::max);
            let avg = us.iter().sum::<f64>() / us.len() as f64;
            line += &format!("; rtt min/avg/max {min:.1}/{avg:.1}/{max:.1} us");
        }
        line
    }
}

/// An lcore's app with the pinger around it: every lcore records the
/// replies it receives; the one made with `sends` also sends requests.
pub struct Pinger<A> {
    inner: A,
    state: Option<Arc<Mutex<PingState>>>,
    sends: bool,
    next_at: Instant,
    replies: Vec<EchoReply>,
}

impl<A> Pinger<A> {
    /// `state` None: no ping runs, `inner` alone.
    pub fn new(inner: A, state: Option<Arc<Mutex<PingState>>>, sends: bool) -> Pinger<A> {
        Pinger {
            inner,
            state,
            sends,
            next_at: Instant::now(),
            replies: Vec::new(),
        }
    }

    pub fn into_inner(self) -> A {
        self.inner
    }

    fn ping<P: EchoIo>(&mut self, io: &mut P, state: &Mutex<PingState>) -> usize {
        let now = Instant::now();
        let mut moved = 0;
        io.take_echo_replies(&mut self.replies);
        if !self.replies.is_empty() {
            let mut s = state.lock().expect("ping state");
            for r in self.replies.drain(..) {
                s.record(&r, now);
                moved += 1;
            }
        }
        if self.sends && now >= self.next_at {
            let mut s = state.lock().expect("ping state");
            if !s.done_sending() {
                let seq = (s.sent + s.unsent) as u16;
                let (target, ident, data_len) = (s.config.target, s.ident, s.config.data_len);
                if io.send_echo_request(target, ident, seq, data_len) {
                    s.sent += 1;
                    if s.outstanding.len() == MAX_OUTSTANDING {
                        s.outstanding.pop_front();
                    }
                    s.outstanding.push_back((seq, now));
                } else {
                    s.unsent += 1;
                }
                moved += 1;
            }
            self.next_at = now + s.config.interval;
        }
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
        self.inner.drain(io);
    }

    fn counters(&self) -> Counters {
        self.inner.counters()
    }
}
