//! Per-lcore packet counters. Each lcore counts into its own plain
//! `Counters` and publishes a copy to a `SharedCounters` now and then, so the
//! fast path never touches a shared cache line.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a packet was dropped. Every drop is counted under exactly one reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Shorter than its headers say.
    Truncated,
    /// Headers that make no sense (IPv4 version, IHL, lengths, ARP types).
    Malformed,
    BadChecksum,
    /// IPv4 fragments: we send with DF and do not reassemble.
    Fragmented,
    /// Destination MAC neither ours nor broadcast.
    ForeignMac,
    /// A VLAN tag other than the host's (or a tag where none is configured).
    WrongVlan,
    /// EtherType other than IPv4 and ARP.
    UnsupportedEtherType,
    /// IPv4 protocol other than ICMP and UDP.
    UnsupportedProtocol,
    /// IPv4 or ARP target address not ours.
    NotForUs,
    /// UDP to a port nobody listens on.
    NoListener,
    /// Destination outside the subnet and no gateway configured.
    NoRoute,
    /// ARP resolution timed out or its queue was full.
    Unresolved,
    /// The tx queue had no room: for a reply the stack made itself (also
    /// counted as made, `arp_replies_out` or `icmp_echo_replies`), an
    /// app's datagram, or frames released by an ARP resolution.
    TxFull,
    /// A software-steering ring to another lcore was full.
    SteerRingFull,
    /// The mempool was empty.
    NoMbuf,
    /// Dropped on purpose by an impairment (`--impair`, experiments).
    Impaired,
    /// The kernel refused a datagram (kernel UDP backend).
    SendError,
    /// A frame received in several mbufs: the stack handles single-segment
    /// packets only (size the pool for the MTU: `RuntimeConfig::mtu`).
    Segmented,
    /// A source no host can have (broadcast, multicast, 0.0.0.0, loopback,
    /// our own address, a group MAC, UDP port 0): RFC 1122 discards them,
    /// and a reply would go to every host on the link or to none.
    BadSource,
    /// A datagram to send whose buffer had no room in front for its
    /// headers (not one of this backend's own buffers).
    NoHeadroom,
}

impl DropReason {
    pub const ALL: [DropReason; 20] = [
        DropReason::Truncated,
        DropReason::Malformed,
        DropReason::BadChecksum,
        DropReason::Fragmented,
        DropReason::ForeignMac,
        DropReason::WrongVlan,
        DropReason::UnsupportedEtherType,
        DropReason::UnsupportedProtocol,
        DropReason::NotForUs,
        DropReason::NoListener,
        DropReason::NoRoute,
        DropReason::Unresolved,
        DropReason::TxFull,
        DropReason::SteerRingFull,
        DropReason::NoMbuf,
        DropReason::Impaired,
        DropReason::SendError,
        DropReason::Segmented,
        DropReason::BadSource,
        DropReason::NoHeadroom,
    ];
    pub const COUNT: usize = Self::ALL.len();

    pub fn name(self) -> &'static str {
        match self {
            DropReason::Truncated => "truncated",
            DropReason::Malformed => "malformed",
            DropReason::BadChecksum => "bad_checksum",
            DropReason::Fragmented => "fragmented",
            DropReason::ForeignMac => "foreign_mac",
            DropReason::WrongVlan => "wrong_vlan",
            DropReason::UnsupportedEtherType => "unsupported_ethertype",
            DropReason::UnsupportedProtocol => "unsupported_protocol",
            DropReason::NotForUs => "not_for_us",
            DropReason::NoListener => "no_listener",
            DropReason::NoRoute => "no_route",
            DropReason::Unresolved => "unresolved",
            DropReason::TxFull => "tx_full",
            DropReason::SteerRingFull => "steer_ring_full",
            DropReason::NoMbuf => "no_mbuf",
            DropReason::Impaired => "impaired",
            DropReason::SendError => "send_error",
            DropReason::Segmented => "segmented",
            DropReason::BadSource => "bad_source",
            DropReason::NoHeadroom => "no_headroom",
        }
    }
}

/// The counters one lcore keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_bursts: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_bursts: u64,
    pub arp_requests_in: u64,
    pub arp_replies_out: u64,
    pub arp_requests_out: u64,
    pub icmp_echo_replies: u64,
    pub udp_in: u64,
    /// UDP datagrams taken for sending: held for the device, or queued
    /// while their next hop resolves (those ARP then gives up on are
    /// also counted as `unresolved` drops).
    pub udp_out: u64,
    /// Packets this lcore handed to another one: software steering, or a
    /// payload that names another lcore (`RuntimeConfig::payload_owner`).
    pub steered: u64,
    /// What an impairment (`--impair`) did to sent packets besides
    /// dropping them (counted under `DropReason::Impaired`).
    pub impair_duplicated: u64,
    pub impair_reordered: u64,
    pub impair_corrupted: u64,
    /// Naps the lcore's loop took while idle (`IdlePolicy::Adaptive`).
    pub idle_naps: u64,
    /// ICMP messages for us other than echo requests and replies
    /// (destination unreachable, time exceeded, ...): taken, not acted on.
    pub icmp_other_in: u64,
    pub drops: [u64; DropReason::COUNT],
}

/// Counters kept as plain fields (the drops follow them in the array).
const FIELDS: usize = 18;

impl Counters {
    pub fn drop(&mut self, reason: DropReason) {
        self.drops[reason as usize] += 1;
    }

    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize]
    }

    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Field-wise sum, for totals over lcores.
    pub fn add(&mut self, o: &Counters) {
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.rx_bursts += o.rx_bursts;
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        self.tx_bursts += o.tx_bursts;
        self.arp_requests_in += o.arp_requests_in;
        self.arp_replies_out += o.arp_replies_out;
        self.arp_requests_out += o.arp_requests_out;
        self.icmp_echo_replies += o.icmp_echo_replies;
        self.udp_in += o.udp_in;
        self.udp_out += o.udp_out;
        self.steered += o.steered;
        self.impair_duplicated += o.impair_duplicated;
        self.impair_reordered += o.impair_reordered;
        self.impair_corrupted += o.impair_corrupted;
        self.idle_naps += o.idle_naps;
        self.icmp_other_in += o.icmp_other_in;
        for (d, s) in self.drops.iter_mut().zip(o.drops.iter()) {
            *d += s;
        }
    }

    /// Non-zero drop counts by name.
    pub fn drop_list(&self) -> Vec<(&'static str, u64)> {
        DropReason::ALL
            .iter()
            .filter(|r| self.dropped(**r) > 0)
            .map(|r| (r.name(), self.dropped(*r)))
            .collect()
    }

    fn as_array(&self) -> [u64; FIELDS + DropReason::COUNT] {
        let mut a = [0u64; FIELDS + DropReason::COUNT];
        a[..FIELDS].copy_from_slice(&[
            self.rx_packets,
            self.rx_bytes,
            self.rx_bursts,
            self.tx_packets,
            self.tx_bytes,
            self.tx_bursts,
            self.arp_requests_in,
            self.arp_replies_out,
            self.arp_requests_out,
            self.icmp_echo_replies,
            self.udp_in,
            self.udp_out,
            self.steered,
            self.impair_duplicated,
            self.impair_reordered,
            self.impair_corrupted,
            self.idle_naps,
            self.icmp_other_in,
        ]);
        a[FIELDS..].copy_from_slice(&self.drops);
        a
    }

    fn from_array(a: &[u64; FIELDS + DropReason::COUNT]) -> Counters {
        let mut drops = [0u64; DropReason::COUNT];
        drops.copy_from_slice(&a[FIELDS..]);
        Counters {
            rx_packets: a[0],
            rx_bytes: a[1],
            rx_bursts: a[2],
            tx_packets: a[3],
            tx_bytes: a[4],
            tx_bursts: a[5],
            arp_requests_in: a[6],
            arp_replies_out: a[7],
            arp_requests_out: a[8],
            icmp_echo_replies: a[9],
            udp_in: a[10],
            udp_out: a[11],
            steered: a[12],
            impair_duplicated: a[13],
            impair_reordered: a[14],
            impair_corrupted: a[15],
            idle_naps: a[16],
            icmp_other_in: a[17],
            drops,
        }
    }
}

/// A published copy of one lcore's counters, readable from any thread.
/// Fields are stored one by one (Relaxed): a reader may see a snapshot
/// that is a few packets stale, never a torn counter.
#[derive(Debug)]
pub struct SharedCounters {
    slots: [AtomicU64; FIELDS + DropReason::COUNT],
}

impl Default for SharedCounters {
    fn default() -> Self {
        SharedCounters {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl SharedCounters {
    pub fn publish(&self, c: &Counters) {
        for (slot, v) in self.slots.iter().zip(c.as_array()) {
            slot.store(v, Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> Counters {
        let a = std::array::from_fn(|i| self.slots[i].load(Ordering::Relaxed));
        Counters::from_array(&a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_are_counted_by_reason_and_published_whole() {
        let mut c = Counters::default();
        c.drop(DropReason::BadChecksum);
        c.drop(DropReason::BadChecksum);
        c.drop(DropReason::NoMbuf);
        c.rx_packets = 7;
        c.steered = 3;
        c.impair_corrupted = 5;
        assert_eq!(c.dropped(DropReason::BadChecksum), 2);
        assert_eq!(c.total_drops(), 3);
        assert_eq!(c.drop_list(), vec![("bad_checksum", 2), ("no_mbuf", 1)]);
        let shared = SharedCounters::default();
        shared.publish(&c);
        assert_eq!(shared.snapshot(), c);
        let mut sum = c.clone();
        sum.add(&c);
        assert_eq!(sum.rx_packets, 14);
        assert_eq!(sum.dropped(DropReason::BadChecksum), 4);
    }
}
