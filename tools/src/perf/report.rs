//! Statistics: periodic blocks printed the way testpmd prints `show port
//! stats`, a final summary, and the JSON object for scripts.

use std::time::Instant;

use dpdk_ffi::{Port, PortStats};
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PortReport {
    pub port: String,
    pub rx_pps: f64,
    pub tx_pps: f64,
    pub rx_bps: f64,
    pub tx_bps: f64,
    pub rx_missed: u64,
    pub tx_dropped: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub mode: String,
    pub duration_s: f64,
    pub ports: Vec<PortReport>,
    pub total_rx_pps: f64,
    pub total_tx_pps: f64,
}

/// A port's counters at one instant.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    pub at: Instant,
    pub stats: PortStats,
    pub tx_dropped: u64,
}

impl Snapshot {
    pub fn take(port: &Port, tx_dropped: u64) -> Snapshot {
        Snapshot {
            at: Instant::now(),
            stats: port.stats().unwrap_or_default(),
            tx_dropped,
        }
    }
}

/// Rates between two snapshots.
pub fn rates(name: &str, from: &Snapshot, to: &Snapshot) -> PortReport {
    let secs = to.at.duration_since(from.at).as_secs_f64().max(1e-9);
    let d = |a: u64, b: u64| b.saturating_sub(a) as f64;
    PortReport {
        port: name.to_owned(),
        rx_pps: d(from.stats.rx_packets, to.stats.rx_packets) / secs,
        tx_pps: d(from.stats.tx_packets, to.stats.tx_packets) / secs,
        rx_bps: d(from.stats.rx_bytes, to.stats.rx_bytes) * 8.0 / secs,
        tx_bps: d(from.stats.tx_bytes, to.stats.tx_bytes) * 8.0 / secs,
        rx_missed: to.stats.rx_missed.saturating_sub(from.stats.rx_missed),
        tx_dropped: to.tx_dropped.saturating_sub(from.tx_dropped),
    }
}

/// testpmd's `show port stats` block: totals since start, then throughput
/// since the last print.
pub fn print_period(id: usize, total: &Snapshot, since_start: &Snapshot, rate: &PortReport) {
    let s = total.stats.saturating_sub(&since_start.stats);
    let bar = "#".repeat(24);
    crate::oline!("\n  {bar} NIC statistics for port {id:<2} {bar}");
    crate::oline!(
        "  RX-packets: {:<10} RX-missed: {:<10} RX-bytes:  {}",
        s.rx_packets,
        s.rx_missed,
        s.rx_bytes
    );
    crate::oline!("  RX-errors: {}", s.rx_errors);
    crate::oline!("  RX-nombuf:  {:<10}", s.rx_nombuf);
    crate::oline!(
        "  TX-packets: {:<10} TX-errors: {:<10} TX-bytes:  {}",
        s.tx_packets,
        s.tx_errors,
        s.tx_bytes
    );
    crate::oline!("\n  Throughput (since last show)");
    crate::oline!(
        "  Rx-pps: {:>12.0}          Rx-bps: {:>12.0}",
        rate.rx_pps,
        rate.rx_bps
    );
    crate::oline!(
        "  Tx-pps: {:>12.0}          Tx-bps: {:>12.0}",
        rate.tx_pps,
        rate.tx_bps
    );
    crate::oline!("  {}", "#".repeat(76));
}

pub fn print_summary(sum: &Summary) {
    crate::oline!(
        "\n  ---------------------- {} summary over {:.2} s ----------------------",
        sum.mode,
        sum.duration_s
    );
    for (i, p) in sum.ports.iter().enumerate() {
        crate::oline!(
            "  port {i} ({}): Rx-pps {:>12.0}  Tx-pps {:>12.0}  Rx-bps {:>14.0}  Tx-bps {:>14.0}  RX-missed {}  TX-dropped {}",
            p.port, p.rx_pps, p.tx_pps, p.rx_bps, p.tx_bps, p.rx_missed, p.tx_dropped
        );
    }
    crate::oline!(
        "  total: Rx-pps {:.0} ({:.2} Mpps)  Tx-pps {:.0} ({:.2} Mpps)",
        sum.total_rx_pps,
        sum.total_rx_pps / 1e6,
        sum.total_tx_pps,
        sum.total_tx_pps / 1e6
    );
}

trait SaturatingSub {
    fn saturating_sub(&self, other: &Self) -> Self;
}

impl SaturatingSub for PortStats {
    fn saturating_sub(&self, o: &Self) -> Self {
        PortStats {
            rx_packets: self.rx_packets.saturating_sub(o.rx_packets),
            tx_packets: self.tx_packets.saturating_sub(o.tx_packets),
            rx_bytes: self.rx_bytes.saturating_sub(o.rx_bytes),
            tx_bytes: self.tx_bytes.saturating_sub(o.tx_bytes),
            rx_missed: self.rx_missed.saturating_sub(o.rx_missed),
            rx_errors: self.rx_errors.saturating_sub(o.rx_errors),
            tx_errors: self.tx_errors.saturating_sub(o.tx_errors),
            rx_nombuf: self.rx_nombuf.saturating_sub(o.rx_nombuf),
        }
    }
}
