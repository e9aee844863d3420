//! Black-hole detection for path MTU discovery (RFC 8899 section 4.3).
//!
//! quiche's PMTUD searches once, when the connection starts, and then
//! keeps the size it found. If the path later stops carrying packets of
//! that size (a route moves onto a tunnel, a link's MTU is lowered) and
//! ICMP does not say so, every full-size packet and every retransmission
//! of it is lost: the connection keeps firing probe timeouts and never
//! makes progress again. A connection that has fired `PTOS` probe
//! timeouts with nothing acknowledged in between has its path size
//! checked again (quiche's `revalidate_pmtu`: back to QUIC's 1200-byte
//! floor at once, then a new search), once per such stall.

/// Probe timeouts without any acknowledged byte before the path size is
/// checked again: one can be a lost tail, two in a row are a stall.
pub const PTOS: usize = 2;

/// Per connection: what was acknowledged, and the probe timeouts counted,
/// when it last made progress.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BlackholeWatch {
    acked_bytes: u64,
    ptos_at_progress: usize,
    revalidated: bool,
}

impl BlackholeWatch {
    /// After the connection's timers ran, given its acknowledged bytes and
    /// its probe timeouts so far: whether to check its path size again now.
    pub fn stalled(&mut self, acked_bytes: u64, ptos: usize) -> bool {
        if acked_bytes != self.acked_bytes {
            *self = BlackholeWatch {
                acked_bytes,
                ptos_at_progress: ptos,
                revalidated: false,
            };
            return false;
        }
        if self.revalidated || ptos < self.ptos_at_progress + PTOS {
            return false;
        }
        self.revalidated = true;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_is_two_probe_timeouts_without_progress_and_is_acted_on_once() {
        let mut w = BlackholeWatch::default();
        assert!(!w.stalled(1000, 0), "progress");
        assert!(!w.stalled(1000, 1), "one timeout can be a lost tail");
        assert!(w.stalled(1000, 2), "two in a row: check the path size");
        assert!(!w.stalled(1000, 3), "once per stall");
        assert!(!w.stalled(1000, 9), "still the same stall");
        assert!(!w.stalled(5000, 9), "progress again: a new count starts");
        assert!(!w.stalled(5000, 10));
        assert!(w.stalled(5000, 11), "a second stall is acted on too");
    }

    #[test]
    fn timeouts_between_progress_are_not_a_stall() {
        let mut w = BlackholeWatch::default();
        for i in 0..10 {
            // One probe timeout, then something acknowledged, each time.
            assert!(!w.stalled(i * 100, i as usize));
        }
    }
}
