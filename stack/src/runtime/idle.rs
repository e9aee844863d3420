//! What a poll loop does when a poll found nothing. Busy polling gives the
//! lowest latency on isolated cores; on shared cores (CI, laptops, the two
//! cores of a test VM) loops that never yield starve everything else.

use std::cell::Cell;
use std::time::Duration;

/// Timer slack for threads that nap between polls (Linux's default is
/// 50 us, which made a 50 us nap last 105 us here, and 56 us with this).
const NAP_TIMER_SLACK_NS: u64 = 1_000;

thread_local! {
    static SLACK_SET: Cell<bool> = const { Cell::new(false) };
}

/// Lets this thread's short sleeps and poll timeouts end when asked
/// rather than up to 50 us later; once per thread, later calls are free.
/// Call from a polling thread before it naps.
pub fn tighten_timer_slack() {
    if SLACK_SET.with(|s| s.replace(true)) {
        return;
    }
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_timerslack(NAP_TIMER_SLACK_NS as _) {
        tracing::debug!(error = %e, "PR_SET_TIMERSLACK failed; naps may overshoot by 50 us");
    }
}

/// This thread's timer slack in nanoseconds (for tests and logs).
#[cfg(target_os = "linux")]
pub fn timer_slack_ns() -> Option<u64> {
    nix::sys::prctl::get_timerslack().ok().map(|v| v as u64)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdlePolicy {
    /// Never yield: for lcores pinned to isolated cores.
    Busy,
    /// Spin, then rte_pause, then sleep briefly while nothing arrives.
    #[default]
    Adaptive,
}

impl std::str::FromStr for IdlePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "busy" => Ok(IdlePolicy::Busy),
            "adaptive" => Ok(IdlePolicy::Adaptive),
            other => Err(format!(
                "unknown idle policy '{other}': use busy or adaptive"
            )),
        }
    }
}

#[derive(Debug)]
pub struct Backoff {
    policy: IdlePolicy,
    empty_polls: u32,
    naps: u64,
}

impl Backoff {
    const PAUSE_AFTER: u32 = 64;
    const SLEEP_AFTER: u32 = 4096;
    const SLEEP: Duration = Duration::from_micros(100);

    /// A backoff for the calling thread's loop (it tightens the thread's
    /// timer slack, so the naps last what they ask).
    pub fn new(policy: IdlePolicy) -> Self {
        tighten_timer_slack();
        Backoff {
            policy,
            empty_polls: 0,
            naps: 0,
        }
    }

    /// Call after every poll with how much work it did.
    #[inline]
    pub fn after_poll(&mut self, work: usize) {
        if work > 0 || self.policy == IdlePolicy::Busy {
            self.empty_polls = 0;
            return;
        }
        self.empty_polls = self.empty_polls.saturating_add(1);
        if self.empty_polls >= Self::SLEEP_AFTER {
            self.naps += 1;
            std::thread::sleep(Self::SLEEP);
        } else if self.empty_polls >= Self::PAUSE_AFTER {
            dpdk_ffi::lcore::pause();
        }
    }

    /// True once the loop has been idle long enough to be sleeping.
    pub fn is_sleeping(&self) -> bool {
        self.empty_polls >= Self::SLEEP_AFTER
    }

    /// Naps taken so far.
    pub fn naps(&self) -> u64 {
        self.naps
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_polling_thread_gets_a_one_microsecond_timer_slack() {
        std::thread::spawn(|| {
            nix::sys::prctl::set_timerslack(50_000).unwrap();
            assert_eq!(timer_slack_ns(), Some(50_000));
            let _backoff = Backoff::new(IdlePolicy::Adaptive);
            assert_eq!(timer_slack_ns(), Some(NAP_TIMER_SLACK_NS));
        })
        .join()
        .unwrap();
    }

    /// Adaptive: no nap in the first SLEEP_AFTER - 1 idle polls, one
    /// (of at least 100 us) per idle poll after, none again once a poll
    /// had work until the loop is idle that long again. Busy never naps.
    #[test]
    fn adaptive_backoff_sleeps_only_after_a_long_idle_and_busy_never() {
        let idle_polls = |b: &mut Backoff, n: u32| {
            let t0 = std::time::Instant::now();
            for _ in 0..n {
                b.after_poll(0);
            }
            t0.elapsed()
        };
        let mut b = Backoff::new(IdlePolicy::Adaptive);
        idle_polls(&mut b, Backoff::SLEEP_AFTER - 1);
        assert_eq!(b.naps(), 0);
        assert!(!b.is_sleeping());
        let slept = idle_polls(&mut b, 20);
        assert_eq!(b.naps(), 20);
        assert!(slept >= 20 * Backoff::SLEEP, "{slept:?}");
        b.after_poll(1);
        assert!(!b.is_sleeping());
        idle_polls(&mut b, Backoff::SLEEP_AFTER - 1);
        assert_eq!(b.naps(), 20, "spinning again after work");

        let mut busy = Backoff::new(IdlePolicy::Busy);
        idle_polls(&mut busy, 2 * Backoff::SLEEP_AFTER);
        assert_eq!(busy.naps(), 0);
        assert!(!busy.is_sleeping());
    }

    #[test]
    fn the_slack_is_set_once_per_thread() {
        std::thread::spawn(|| {
            tighten_timer_slack();
            // Changed behind its back: a second call does not make the
            // syscall again.
            nix::sys::prctl::set_timerslack(50_000).unwrap();
            tighten_timer_slack();
            assert_eq!(timer_slack_ns(), Some(50_000));
        })
        .join()
        .unwrap();
    }
}
