//! Receive-side scaling in software: the Toeplitz hash NICs use, the queue a
//! hash lands on, and picking a source port so that a flow's replies land
//! on the lcore that owns the flow (as Machnet does). The software steering
//! fallback uses the same functions, so both paths agree.

use std::net::{Ipv4Addr, SocketAddrV4};

/// 40 bytes of 0x6d5a: a Toeplitz key for which hash(a->b) == hash(b->a),
/// so both directions of a flow land on the same queue.
pub const SYMMETRIC_KEY: [u8; 40] = {
    let mut k = [0u8; 40];
    let mut i = 0;
    while i < 40 {
        k[i] = if i % 2 == 0 { 0x6d } else { 0x5a };
        i += 1;
    }
    k
};

/// The key most NIC drivers default to (Microsoft's RSS verification key).
pub const DEFAULT_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// Toeplitz hash of `input` under `key` (key must be >= input + 4 bytes).
pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    assert!(key.len() >= input.len() + 4, "Toeplitz key too short");
    let mut hash = 0u32;
    // The 32-bit window of the key starting at the current input bit.
    let mut window = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
    for (i, byte) in input.iter().enumerate() {
        let next = key[i + 4];
        for bit in 0..8 {
            if byte & (0x80 >> bit) != 0 {
                hash ^= window;
            }
            window = (window << 1) | u32::from((next >> (7 - bit)) & 1);
        }
    }
    hash
}

/// The hash a NIC computes for an IPv4/UDP packet from `src` to `dst`.
pub fn udp4_hash(key: &[u8], src: Ipv4Addr, dst: Ipv4Addr, src_port: u16, dst_port: u16) -> u32 {
    let mut input = [0u8; 12];
    input[..4].copy_from_slice(&src.octets());
    input[4..8].copy_from_slice(&dst.octets());
    input[8..10].copy_from_slice(&src_port.to_be_bytes());
    input[10..].copy_from_slice(&dst_port.to_be_bytes());
    toeplitz(key, &input)
}

/// How hashes map to queues: the default redirection table of ethdev
/// (entry i -> queue i % queues), or plain modulo when there is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueMap {
    pub queues: u16,
    pub reta_size: u16,
}

impl QueueMap {
    pub fn queue_of(&self, hash: u32) -> u16 {
        let q = self.queues.max(1) as u32;
        if self.reta_size == 0 {
            (hash % q) as u16
        } else {
            ((hash % self.reta_size as u32) % q) as u16
        }
    }
}

/// A local port in `range` such that replies from `remote:remote_port` to
/// `local:port` hash to `queue`: the flow then stays on the lcore owning
/// that queue without any hand-off. `None` if no port in the range fits.
pub fn pick_source_port(
    key: &[u8],
    map: QueueMap,
    queue: u16,
    local: Ipv4Addr,
    remote: Ipv4Addr,
    remote_port: u16,
    range: std::ops::RangeInclusive<u16>,
) -> Option<u16> {
    range
        .into_iter()
        .find(|&p| map.queue_of(udp4_hash(key, remote, local, remote_port, p)) == queue)
}

/// Where a port's receive side puts a flow: the Toeplitz key and queue map
/// the NIC (or our software steering) uses, for a runtime that knows them.
/// Queue i is lcore i.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowPlacement {
    pub map: QueueMap,
    pub key: Vec<u8>,
}

impl FlowPlacement {
    /// One queue: every flow lands on lcore 0.
    pub fn single_queue() -> FlowPlacement {
        FlowPlacement {
            map: QueueMap {
                queues: 1,
                reta_size: 0,
            },
            key: DEFAULT_KEY.to_vec(),
        }
    }

    /// The lcore that receives what `remote` sends to `local`.
    pub fn lcore_of_reply(&self, local: SocketAddrV4, remote: SocketAddrV4) -> u16 {
        let h = udp4_hash(
            &self.key,
            *remote.ip(),
            *local.ip(),
            remote.port(),
            local.port(),
        );
        self.map.queue_of(h)
    }

    /// The first local port from `from` up whose replies from `remote`
    /// land on `lcore`.
    pub fn source_port_for(
        &self,
        lcore: u16,
        local: Ipv4Addr,
        remote: SocketAddrV4,
        from: u16,
    ) -> Option<u16> {
        pick_source_port(
            &self.key,
            self.map,
            lcore,
            local,
            *remote.ip(),
            remote.port(),
            from..=u16::MAX,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Verification vectors from Microsoft's RSS documentation (IPv4 with
    // ports) under DEFAULT_KEY: source 66.9.149.187:2794 -> 161.142.100.80:1766.
    #[test]
    fn matches_published_verification_vectors() {
        let h = udp4_hash(
            &DEFAULT_KEY,
            Ipv4Addr::new(66, 9, 149, 187),
            Ipv4Addr::new(161, 142, 100, 80),
            2794,
            1766,
        );
        assert_eq!(h, 0x51cc_c178);
        let h = udp4_hash(
            &DEFAULT_KEY,
            Ipv4Addr::new(199, 92, 111, 2),
            Ipv4Addr::new(65, 69, 140, 83),
            14230,
            4739,
        );
        assert_eq!(h, 0xc626_b0ea);
    }

    #[test]
    fn symmetric_key_hashes_both_directions_alike() {
        let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        for (pa, pb) in [(1, 2), (4433, 50000), (65535, 0)] {
            assert_eq!(
                udp4_hash(&SYMMETRIC_KEY, a, b, pa, pb),
                udp4_hash(&SYMMETRIC_KEY, b, a, pb, pa)
            );
        }
    }

    #[test]
    fn picked_source_port_lands_replies_on_the_owner_queue() {
        let map = QueueMap {
            queues: 4,
            reta_size: 128,
        };
        let (local, remote) = (Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::new(10, 0, 0, 9));
        for queue in 0..4 {
            let p = pick_source_port(&DEFAULT_KEY, map, queue, local, remote, 4433, 49152..=65535)
                .unwrap();
            let h = udp4_hash(&DEFAULT_KEY, remote, local, 4433, p);
            assert_eq!(map.queue_of(h), queue);
        }
    }

    #[test]
    fn placement_picks_ports_whose_replies_come_back_to_each_lcore() {
        let placement = FlowPlacement {
            map: QueueMap {
                queues: 3,
                reta_size: 0,
            },
            key: DEFAULT_KEY.to_vec(),
        };
        let local = Ipv4Addr::new(10, 0, 0, 2);
        let remote = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 9), 4433);
        let mut seen = std::collections::HashSet::new();
        for lcore in 0..3 {
            let mut from = 40_000;
            for _ in 0..4 {
                let p = placement
                    .source_port_for(lcore, local, remote, from)
                    .unwrap();
                assert!(p >= from && seen.insert(p), "fresh port {p}");
                let me = SocketAddrV4::new(local, p);
                assert_eq!(placement.lcore_of_reply(me, remote), lcore);
                from = p + 1;
            }
        }
        let one = FlowPlacement::single_queue();
        assert_eq!(one.source_port_for(0, local, remote, 50_000), Some(50_000));
        assert_eq!(one.source_port_for(1, local, remote, 50_000), None);
    }
}
