//! Stall detection: a connection whose probe timeouts fire without real
//! progress in between is stuck, whatever else it hears from its peer.
//! Two things follow from it:
//!
//! - Black-hole detection for path MTU discovery (RFC 8899 section 4.3).
//!   quiche's PMTUD searches once, when the connection starts, and then
//!   keeps the size it found. If the path later stops carrying packets of
//!   that size (a route moves onto a tunnel, a link's MTU is lowered) and
//!   ICMP does not say so, every full-size packet and every
//!   retransmission of it is lost. After `PTOS` probe timeouts without
//!   progress the path size is checked again (quiche's `revalidate_pmtu`:
//!   back to QUIC's 1200-byte floor at once, then a new search), once per
//!   such stall.
//! - The end of a connection that cannot recover. Without PMTUD (or on a
//!   path that loses every packet we send while the peer's reach us),
//!   the peer's acknowledgements and keepalives keep quiche's idle timer
//!   from ever running out, and quiche would retransmit forever. The
//!   endpoint ends a connection stalled for its idle timeout; the
//!   collectives fail a collective whose peer stalls for their timeout.
//!
//! Progress is at least one byte acknowledged for every `LOST_PER_ACKED`
//! lost since the last progress, not merely something acknowledged: on a
//! path that drops big packets, the small ones get through (a PING quiche
//! adds to its ACKs now and then so that the peer acknowledges them, some
//! 50 bytes against two lost 1472-byte probes per probe timeout), and
//! each of those would otherwise restart the count while every byte of
//! data is lost. A link that loses most but still carries a useful share
//! (up to 8 in 9 bytes lost) keeps counting as progress.

use std::time::Instant;

/// Probe timeouts without progress before the path size is checked
/// again: one can be a lost tail, two in a row are a stall.
pub const PTOS: usize = 2;

/// Bytes lost per byte acknowledged beyond which there is no progress.
pub const LOST_PER_ACKED: u64 = 8;

/// A connection's byte counts, as quiche keeps them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub acked: u64,
    pub lost: u64,
}

impl Delivery {
    /// Whether, since `base`, something was acknowledged, and at least a
    /// byte for every `LOST_PER_ACKED` lost.
    fn progressed_since(&self, base: &Delivery) -> bool {
        let acked = self.acked.saturating_sub(base.acked);
        let lost = self.lost.saturating_sub(base.lost);
        acked > 0 && acked.saturating_mul(LOST_PER_ACKED) >= lost
    }
}

/// Per connection: its byte counts and probe timeouts when it last made
/// progress, and since when it has not.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StallWatch {
    at_progress: Delivery,
    ptos_at_progress: usize,
    /// When the first probe timeout without progress was seen.
    since: Option<Instant>,
    rechecked: bool,
}

impl StallWatch {
    /// After the connection's timers ran at `now`, given its byte counts
    /// and its probe timeouts so far: whether to check its path size
    /// again now.
    pub fn observe(&mut self, now_at: Delivery, ptos: usize, now: Instant) -> bool {
        // Fewer timeouts than before: a new path, counted from zero.
        if now_at.progressed_since(&self.at_progress) || ptos < self.ptos_at_progress {
            *self = StallWatch {
                at_progress: now_at,
                ptos_at_progress: ptos,
                since: None,
                rechecked: false,
            };
            return false;
        }
        if ptos == self.ptos_at_progress {
            return false;
        }
        self.since.get_or_insert(now);
        if self.rechecked || ptos < self.ptos_at_progress + PTOS {
            return false;
        }
        self.rechecked = true;
        true
    }

    /// When the stall under way at the last `observe` began, if any
    /// (progress since may have ended it): for scheduling a check.
    pub fn started(&self) -> Option<Instant> {
        self.since
    }

    /// Since when the connection has made no progress, given its byte
    /// counts now: from its first probe timeout after the last progress.
    /// `None` when it has progressed since.
    pub fn stalled_since(&self, now_at: Delivery) -> Option<Instant> {
        self.since
            .filter(|_| !now_at.progressed_since(&self.at_progress))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(acked: u64, lost: u64) -> Delivery {
        Delivery { acked, lost }
    }

    #[test]
    fn a_stall_is_two_probe_timeouts_without_progress_and_is_acted_on_once() {
        let now = Instant::now();
        let mut w = StallWatch::default();
        assert!(!w.observe(at(1000, 0), 0, now), "progress");
        assert!(
            !w.observe(at(1000, 0), 1, now),
            "one timeout can be a lost tail"
        );
        assert!(
            w.observe(at(1000, 0), 2, now),
            "two in a row: check the path size"
        );
        assert!(!w.observe(at(1000, 0), 3, now), "once per stall");
        assert!(!w.observe(at(1000, 0), 9, now), "still the same stall");
        assert!(
            !w.observe(at(5000, 0), 9, now),
            "progress again: a new count starts"
        );
        assert!(!w.observe(at(5000, 0), 10, now));
        assert!(
            w.observe(at(5000, 0), 11, now),
            "a second stall is acted on too"
        );
    }

    #[test]
    fn timeouts_between_progress_are_not_a_stall() {
        let now = Instant::now();
        let mut w = StallWatch::default();
        for i in 0..10 {
            // One probe timeout, then more acknowledged than lost, each time.
            let d = at(i * 1000, i * 300);
            assert!(!w.observe(d, i as usize, now));
            assert_eq!(w.stalled_since(d), None);
        }
    }

    #[test]
    fn small_acknowledgements_while_data_is_lost_are_no_progress() {
        let t0 = Instant::now();
        let mut w = StallWatch::default();
        w.observe(at(5000, 0), 0, t0);
        // Each round: two full-size probes lost, one 47-byte PING acked.
        for i in 1..20u64 {
            let d = at(5000 + 47 * i, 2944 * i);
            w.observe(d, i as usize, t0 + Duration::from_millis(40 * i));
            assert_eq!(w.stalled_since(d), Some(t0 + Duration::from_millis(40)));
        }
    }

    #[test]
    fn a_link_that_loses_most_but_carries_some_makes_progress() {
        let now = Instant::now();
        let mut w = StallWatch::default();
        // 85% of the bytes lost, round after round, with probe timeouts.
        for i in 1..20u64 {
            let d = at(150 * i, 850 * i);
            w.observe(d, i as usize, now);
            assert_eq!(w.stalled_since(d), None, "round {i}");
        }
        // Then 95% lost: no progress.
        let d = at(150 * 19 + 50, 850 * 19 + 950);
        w.observe(d, 20, now);
        assert_eq!(w.stalled_since(d), Some(now));
    }

    #[test]
    fn a_stall_dates_from_its_first_probe_timeout_and_ends_with_progress() {
        let t0 = Instant::now();
        let later = |ms| t0 + Duration::from_millis(ms);
        let mut w = StallWatch::default();
        w.observe(at(1000, 0), 0, t0);
        // Other timers (ACK delay, pacing) without a probe timeout.
        w.observe(at(1000, 0), 0, later(50));
        assert_eq!(w.stalled_since(at(1000, 0)), None, "no probe timeout yet");
        w.observe(at(1000, 1400), 1, later(100));
        w.observe(at(1000, 2800), 2, later(300));
        w.observe(at(1000, 4200), 3, later(700));
        assert_eq!(w.stalled_since(at(1000, 4200)), Some(later(100)));
        assert_eq!(
            w.stalled_since(at(6000, 4200)),
            None,
            "the link came back: more acknowledged since than an eighth of what was lost"
        );
        w.observe(at(6000, 4200), 3, later(800));
        assert_eq!(w.stalled_since(at(6000, 4200)), None);
        w.observe(at(6000, 4200), 4, later(900));
        assert_eq!(
            w.stalled_since(at(6000, 4200)),
            Some(later(900)),
            "a new stall"
        );
    }

    #[test]
    fn a_new_path_starts_its_own_count() {
        let now = Instant::now();
        let mut w = StallWatch::default();
        w.observe(at(1000, 0), 5, now);
        // The connection moved to a path with no timeouts yet.
        assert!(!w.observe(at(1000, 0), 0, now));
        assert_eq!(w.stalled_since(at(1000, 0)), None);
        assert!(!w.observe(at(1000, 0), 1, now));
        assert!(w.observe(at(1000, 0), 2, now), "two on the new path");
    }
}
