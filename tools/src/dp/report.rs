//! ainftp-dp's statistics: a line per lcore each period, and the summary.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use stack::counters::{Counters, DropReason, SharedCounters};
use stack::runtime::RunReport;

/// Print per-lcore rates every `period` until `stop` (or `duration` ends,
/// which sets `stop`).
pub fn watch(
    stop: &AtomicBool,
    counters: &[Arc<SharedCounters>],
    lcores: &[u32],
    period: Option<Duration>,
    duration: Option<Duration>,
) {
    let start = Instant::now();
    let mut last: Vec<Counters> = counters.iter().map(|c| c.snapshot()).collect();
    let mut last_at = start;
    let mut next_print = period.map(|p| start + p);
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        let now = Instant::now();
        if duration.is_some_and(|d| now - start >= d) {
            stop.store(true, Ordering::Relaxed);
            break;
        }
        if let (Some(at), Some(p)) = (next_print, period) {
            if now >= at {
                let secs = (now - last_at).as_secs_f64();
                for (i, c) in counters.iter().enumerate() {
                    let cur = c.snapshot();
                    crate::eline!("{}", rate_line(lcores[i], &cur, &last[i], secs));
                    last[i] = cur;
                }
                last_at = now;
                next_print = Some(at + p);
            }
        }
    }
}

fn rate_line(lcore: u32, cur: &Counters, prev: &Counters, secs: f64) -> String {
    let pps = |a: u64, b: u64| (a.saturating_sub(b)) as f64 / secs;
    let drops: Vec<String> = cur
        .drop_list()
        .into_iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect();
    format!(
        "lcore {lcore:>3}: rx-pps {:>11.0}  tx-pps {:>11.0}  rx {:>12}  tx {:>12}  drops [{}]",
        pps(cur.rx_packets, prev.rx_packets),
        pps(cur.tx_packets, prev.tx_packets),
        cur.rx_packets,
        cur.tx_packets,
        drops.join(" ")
    )
}

#[derive(Debug, Clone, Serialize)]
pub struct LcoreSummary {
    pub lcore: u32,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_bursts: u64,
    pub tx_bursts: u64,
    pub udp_in: u64,
    pub udp_out: u64,
    pub steered: u64,
    pub arp_replies: u64,
    pub icmp_echo_replies: u64,
    /// Naps the lcore took while idle (adaptive idle policy).
    pub idle_naps: u64,
    pub drops: std::collections::BTreeMap<String, u64>,
    /// What `--impair` did to sent packets (absent without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impaired: Option<ImpairedSummary>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ImpairedSummary {
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
}

/// `--ping`: requests sent, replies matched, round trips.
#[derive(Debug, Clone, Serialize)]
pub struct PingSummary {
    pub target: String,
    pub sent: u32,
    pub received: u32,
    /// Neither answered nor sent in the last second before the stop.
    pub lost: u32,
    /// Requests the port could not send (no mbuf, no route).
    pub unsent: u32,
    /// Replies to no request in flight (duplicates).
    pub unmatched: u32,
    pub rtt_min_us: Option<f64>,
    pub rtt_avg_us: Option<f64>,
    pub rtt_max_us: Option<f64>,
    /// Percentiles of every round trip (hdrhistogram, 3 significant digits).
    pub rtt_p50_us: Option<f64>,
    pub rtt_p99_us: Option<f64>,
    pub rtt_p999_us: Option<f64>,
    /// The last replies' round trips (at most 64).
    pub recent_rtt_us: Vec<f64>,
    #[serde(skip)]
    line: String,
}

impl PingSummary {
    pub fn new(state: &stack::runtime::PingState) -> PingSummary {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let got = state.received > 0;
        PingSummary {
            target: state.config().target.to_string(),
            sent: state.sent,
            received: state.received,
            lost: state.lost(),
            unsent: state.unsent,
            unmatched: state.unmatched,
            rtt_min_us: got.then(|| us(state.rtt_min)),
            rtt_avg_us: got.then(|| us(state.rtt_sum) / state.received as f64),
            rtt_max_us: got.then(|| us(state.rtt_max)),
            rtt_p50_us: state.rtt_quantile(0.5).map(us),
            rtt_p99_us: state.rtt_quantile(0.99).map(us),
            rtt_p999_us: state.rtt_quantile(0.999).map(us),
            recent_rtt_us: state.recent.iter().map(|r| us(r.rtt)).collect(),
            line: state.summary(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub seconds: f64,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_pps: f64,
    pub tx_pps: f64,
    pub port_rx_packets: u64,
    pub port_tx_packets: u64,
    pub port_rx_missed: u64,
    /// Held by the PMD when the loops started (a stocked receive ring).
    pub mbufs_in_use_at_start: u32,
    pub mbufs_in_use_after_close: u32,
    pub lcores: Vec<LcoreSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ping: Option<PingSummary>,
}

impl Summary {
    /// `impaired`: an impairment ran on the port (`--impair`).
    pub fn new(run: &RunReport, lcores: &[u32], elapsed: Duration, impaired: bool) -> Summary {
        let secs = elapsed.as_secs_f64();
        Summary {
            seconds: secs,
            rx_packets: run.total.rx_packets,
            tx_packets: run.total.tx_packets,
            rx_pps: run.total.rx_packets as f64 / secs,
            tx_pps: run.total.tx_packets as f64 / secs,
            port_rx_packets: run.port.rx_packets,
            port_tx_packets: run.port.tx_packets,
            port_rx_missed: run.port.rx_missed,
            mbufs_in_use_at_start: run.mbufs_in_use_at_start,
            mbufs_in_use_after_close: run.mbufs_in_use_after_close,
            lcores: run
                .per_lcore
                .iter()
                .zip(lcores)
                .map(|(c, &lcore)| LcoreSummary {
                    lcore,
                    rx_packets: c.rx_packets,
                    tx_packets: c.tx_packets,
                    rx_bursts: c.rx_bursts,
                    tx_bursts: c.tx_bursts,
                    udp_in: c.udp_in,
                    udp_out: c.udp_out,
                    steered: c.steered,
                    arp_replies: c.arp_replies_out,
                    icmp_echo_replies: c.icmp_echo_replies,
                    idle_naps: c.idle_naps,
                    drops: c
                        .drop_list()
                        .into_iter()
                        .map(|(n, v)| (n.to_string(), v))
                        .collect(),
                    impaired: impaired.then(|| ImpairedSummary {
                        dropped: c.dropped(DropReason::Impaired),
                        duplicated: c.impair_duplicated,
                        reordered: c.impair_reordered,
                        corrupted: c.impair_corrupted,
                    }),
                })
                .collect(),
            ping: None,
        }
    }

    /// The testpmd-style closing block, on stderr (stdout is for --json).
    pub fn print(&self) {
        crate::eline!(
            "---------------------- ainftp-dp summary ({:.1} s) ----------------------",
            self.seconds
        );
        for l in &self.lcores {
            crate::eline!(
                "  lcore {:>3}: rx {:>12} tx {:>12} udp in/out {}/{} steered {} arp replies {} icmp echo replies {} idle naps {} drops {:?}",
                l.lcore, l.rx_packets, l.tx_packets, l.udp_in, l.udp_out, l.steered, l.arp_replies, l.icmp_echo_replies, l.idle_naps, l.drops
            );
            if let Some(i) = &l.impaired {
                crate::eline!(
                    "             impaired: dropped {} duplicated {} reordered {} corrupted {}",
                    i.dropped,
                    i.duplicated,
                    i.reordered,
                    i.corrupted
                );
            }
        }
        crate::eline!(
            "  total: rx {} ({:.0} pps) tx {} ({:.0} pps); port rx {} tx {} missed {}; mbufs out at start {}, still out after close {}",
            self.rx_packets, self.rx_pps, self.tx_packets, self.tx_pps, self.port_rx_packets,
            self.port_tx_packets, self.port_rx_missed, self.mbufs_in_use_at_start,
            self.mbufs_in_use_after_close
        );
        if let Some(p) = &self.ping {
            crate::eline!("  {}", p.line);
        }
    }
}
