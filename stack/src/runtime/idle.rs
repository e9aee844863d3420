//! What a poll loop does when a poll found nothing. Busy polling gives the
//! lowest latency on isolated cores; on shared cores (CI, laptops, the two
//! cores of a test VM) loops that never yield starve everything else.

use std::time::Duration;

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
}

impl Backoff {
    const PAUSE_AFTER: u32 = 64;
    const SLEEP_AFTER: u32 = 4096;
    const SLEEP: Duration = Duration::from_micros(100);

    pub fn new(policy: IdlePolicy) -> Self {
        Backoff {
            policy,
            empty_polls: 0,
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
            std::thread::sleep(Self::SLEEP);
        } else if self.empty_polls >= Self::PAUSE_AFTER {
            dpdk_ffi::lcore::pause();
        }
    }

    /// True once the loop has been idle long enough to be sleeping.
    pub fn is_sleeping(&self) -> bool {
        self.empty_polls >= Self::SLEEP_AFTER
    }
}
