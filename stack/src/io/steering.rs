//! Frames that belong to another lcore go there over a ring: software RSS
//! from the lcore that owns a port's only rx queue, and the hand-off
//! between lcores that own a queue each, for frames whose payload names
//! another lcore (QUIC connection IDs).

use std::net::Ipv4Addr;

use dpdk_ffi::ring::{Consumer, Mpmc, Producer, Spsc};
use dpdk_ffi::{Mbuf, MbufBatch, TxQueue};

use super::dpdk::{RX_BURST, TX_HOLD};
use crate::counters::{Counters, DropReason};
use crate::rss::{udp4_hash, QueueMap};
use crate::wire::{EthernetFrame, Ipv4Packet};

const ETHERTYPE_IPV4: u16 = 0x0800;
const IP_PROTO_UDP: u8 = 17;

/// Which lcore a received UDP payload belongs to, where the payload says:
/// QUIC packets name the lcore that owns their connection in its ID
/// (`stack::quic::cid::owner_of_datagram`). It outranks the flow hash, so
/// a connection keeps its lcore when its 4-tuple changes (a NAT rebinding)
/// or when the kernel, not a hash we know, picks the rx queue.
pub type PayloadOwner = fn(&[u8]) -> Option<usize>;

/// A ring into another lcore's receive path.
pub enum Outbox {
    /// From the steering lcore, the ring's only producer.
    Steer(Producer<Spsc>),
    /// Into an lcore's inbox, which every other lcore may feed.
    Handoff(Producer<Mpmc>),
}

impl Outbox {
    fn enqueue_burst<const N: usize>(&mut self, batch: &mut MbufBatch<N>) -> usize {
        match self {
            Outbox::Steer(p) => p.enqueue_burst(batch),
            Outbox::Handoff(p) => p.enqueue_burst(batch),
        }
    }
}

/// Frames that belong to another lcore go there over a ring. Two kinds:
/// software RSS on the lcore that owns the single rx queue (each IPv4/UDP
/// frame goes to the lcore its flow hash names, the same Toeplitz hash a
/// NIC would compute), and the hand-off between lcores that each own a
/// queue (only frames whose payload names another lcore move). Both put
/// the payload's owner first; everything unplaced stays here.
pub struct Steering {
    pub key: Vec<u8>,
    /// This lcore's index among the workers.
    pub me: usize,
    /// One ring per worker index (None at `me`).
    pub rings: Vec<Option<Outbox>>,
    /// Place by the flow hash what the payload does not (software RSS);
    /// with queues of their own, the NIC already did.
    spread: bool,
    payload_owner: Option<PayloadOwner>,
    batches: Vec<MbufBatch<RX_BURST>>,
    /// Frames the other lcores hand back for our tx queue (single tx
    /// queue ports), and those the NIC has not taken yet.
    returns: Option<(Consumer<Mpmc>, MbufBatch<TX_HOLD>)>,
}

impl Steering {
    /// Software RSS from the only rx queue.
    pub fn new(key: Vec<u8>, me: usize, rings: Vec<Option<Producer<Spsc>>>) -> Steering {
        let rings = rings.into_iter().map(|r| r.map(Outbox::Steer)).collect();
        Steering::with_rings(key, me, rings, true)
    }

    /// The hand-off between lcores with queues of their own: frames whose
    /// payload `owner` names another lcore go to its inbox (`rings`).
    pub fn handoff(me: usize, rings: Vec<Option<Producer<Mpmc>>>, owner: PayloadOwner) -> Steering {
        let rings = rings.into_iter().map(|r| r.map(Outbox::Handoff)).collect();
        Steering::with_rings(Vec::new(), me, rings, false).with_payload_owner(Some(owner))
    }

    fn with_rings(key: Vec<u8>, me: usize, rings: Vec<Option<Outbox>>, spread: bool) -> Steering {
        let batches = (0..rings.len()).map(|_| MbufBatch::new()).collect();
        Steering {
            key,
            me,
            rings,
            spread,
            payload_owner: None,
            batches,
            returns: None,
        }
    }

    /// Also transmit what the other lcores send back over `ring`.
    pub fn with_returns(mut self, ring: Consumer<Mpmc>) -> Steering {
        self.returns = Some((ring, MbufBatch::new()));
        self
    }

    /// Send what the batches hold for the other lcores; what a full ring
    /// did not take is dropped and counted.
    pub(super) fn flush(&mut self, counters: &mut Counters) {
        for (ring, batch) in self.rings.iter_mut().zip(self.batches.iter_mut()) {
            let (Some(ring), false) = (ring, batch.is_empty()) else {
                continue;
            };
            let n = ring.enqueue_burst(batch);
            counters.steered += n as u64;
            counters.drops[DropReason::SteerRingFull as usize] += batch.len() as u64;
            batch.clear();
        }
    }

    /// On the steering lcore of a single-tx-queue port: send on `q` what
    /// the other lcores handed back (they counted it); returns how many.
    pub(super) fn send_returns(&mut self, q: &mut TxQueue) -> usize {
        let Some((ring, held)) = self.returns.as_mut() else {
            return 0;
        };
        ring.dequeue_burst(held);
        if held.is_empty() {
            return 0;
        }
        q.tx_burst(held)
    }

    /// Place first by what `owner` reads in the UDP payload.
    pub fn with_payload_owner(mut self, owner: Option<PayloadOwner>) -> Steering {
        self.payload_owner = owner;
        self
    }

    /// The worker a frame belongs to.
    fn owner(&self, frame: &[u8]) -> usize {
        let Some(udp) = Udp4Frame::parse(frame) else {
            return self.me;
        };
        let workers = self.rings.len();
        if let Some(owner) = self
            .payload_owner
            .and_then(|f| f(udp.payload))
            .filter(|&o| o < workers)
        {
            return owner;
        }
        if !self.spread {
            return self.me;
        }
        let map = QueueMap {
            queues: workers as u16,
            reta_size: 0,
        };
        map.queue_of(udp.hash(&self.key)) as usize
    }
}

/// The addresses, ports and payload of an unfragmented IPv4/UDP frame,
/// read without checks beyond what finding them needs (the owner lcore
/// checks the rest).
struct Udp4Frame<'a> {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
    payload: &'a [u8],
}

impl<'a> Udp4Frame<'a> {
    fn parse(frame: &'a [u8]) -> Option<Udp4Frame<'a>> {
        let eth = EthernetFrame::new_checked(frame).ok()?;
        if eth.ethertype() != ETHERTYPE_IPV4 {
            return None;
        }
        let ip_bytes = &frame[eth.header_len()..];
        let ip = Ipv4Packet::new_checked(ip_bytes).ok()?;
        if ip.protocol() != IP_PROTO_UDP || ip.is_fragment() {
            return None;
        }
        // Up to the IP length: link padding is not payload.
        let end = usize::from(ip.total_len()).min(ip_bytes.len());
        let l4 = ip_bytes.get(ip.header_len()..end)?;
        let ports = l4.get(..4)?;
        Some(Udp4Frame {
            src: ip.src_addr(),
            dst: ip.dst_addr(),
            src_port: u16::from_be_bytes([ports[0], ports[1]]),
            dst_port: u16::from_be_bytes([ports[2], ports[3]]),
            payload: l4.get(8..).unwrap_or_default(),
        })
    }

    fn hash(&self, key: &[u8]) -> u32 {
        udp4_hash(key, self.src, self.dst, self.src_port, self.dst_port)
    }
}

/// The Toeplitz hash of an unfragmented IPv4/UDP frame's 4-tuple.
pub fn flow_hash(key: &[u8], frame: &[u8]) -> Option<u32> {
    Udp4Frame::parse(frame).map(|u| u.hash(key))
}

/// Batch `m` for the lcore that owns it, if that is not this one (sent
/// at `flush_steered`); else give it back.
pub(super) fn hand_over(
    steering: &mut Option<Steering>,
    counters: &mut Counters,
    m: Mbuf,
) -> Option<Mbuf> {
    let Some(s) = steering.as_mut() else {
        return Some(m);
    };
    let owner = s.owner(m.data());
    if owner == s.me {
        return Some(m);
    }
    if s.batches[owner].push(m).is_err() {
        counters.drop(DropReason::SteerRingFull);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rss::DEFAULT_KEY;

    /// An Ethernet/IPv4/UDP frame from 10.0.0.1:1000 to 10.0.0.2:4433
    /// carrying `payload`, then `padding` bytes of link padding.
    fn frame(payload: &[u8], padding: usize) -> Vec<u8> {
        let udp_len = 8 + payload.len();
        let ip_len = (20 + udp_len) as u16;
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&ip_len.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0x40, 0, 64, IP_PROTO_UDP, 0, 0]);
        f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(&1000u16.to_be_bytes());
        f.extend_from_slice(&4433u16.to_be_bytes());
        f.extend_from_slice(&(udp_len as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f.resize(f.len() + padding, 0);
        f
    }

    #[test]
    fn a_udp_frame_gives_its_tuple_and_payload_without_link_padding() {
        let f = frame(b"quic", 20);
        let u = Udp4Frame::parse(&f).expect("a UDP frame");
        assert_eq!(
            (u.src, u.dst, u.src_port, u.dst_port),
            (
                Ipv4Addr::new(10, 0, 0, 1),
                Ipv4Addr::new(10, 0, 0, 2),
                1000,
                4433
            )
        );
        assert_eq!(u.payload, b"quic");
        let want = udp4_hash(&DEFAULT_KEY, u.src, u.dst, 1000, 4433);
        assert_eq!(flow_hash(&DEFAULT_KEY, &f), Some(want));
    }

    #[test]
    fn fragments_other_protocols_and_truncated_frames_are_not_placed() {
        let mut fragment = frame(b"quic", 0);
        fragment[20] = 0x20; // more fragments
        assert!(Udp4Frame::parse(&fragment).is_none());
        let mut tcp = frame(b"quic", 0);
        tcp[23] = 6;
        assert!(Udp4Frame::parse(&tcp).is_none());
        assert!(Udp4Frame::parse(&frame(b"quic", 0)[..36]).is_none());
        assert!(Udp4Frame::parse(&[]).is_none());
    }
}
