//! Property tests over the public wire API: no input makes a parser panic,
//! emit/parse round-trip, and the UDP checksum catches every single-byte
//! corruption it can catch.
//!
//! Case counts are sized for a debug build; set PROPTEST_CASES to override.

use std::net::Ipv4Addr;

use proptest::prelude::*;
use stack::wire::*;

fn config(default_cases: u32) -> ProptestConfig {
    if std::env::var_os("PROPTEST_CASES").is_some() {
        ProptestConfig::default()
    } else {
        ProptestConfig::with_cases(default_cases)
    }
}

/// Runs every view and parser the receive path would, calling every getter,
/// on whatever the bytes turn out to be. Only panics matter here.
fn parse_chain(frame: &[u8]) {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return;
    };
    let _ = (
        eth.dst_addr(),
        eth.src_addr(),
        eth.vlan_id(),
        eth.header_len(),
    );
    let eth_repr = EthernetRepr::parse(&eth).unwrap();
    match eth_repr.ethertype {
        ether_type::ARP => parse_arp(eth.payload()),
        ether_type::IPV4 => parse_ipv4(eth.payload()),
        _ => {}
    }
}

fn parse_arp(bytes: &[u8]) {
    if let Ok(p) = ArpPacket::new_checked(bytes) {
        let _ = (
            p.operation(),
            p.source_hardware_addr(),
            p.target_protocol_addr(),
        );
        ArpRepr::parse(&p).unwrap();
    }
}

fn parse_ipv4(bytes: &[u8]) {
    let Ok(ip) = Ipv4Packet::new_checked(bytes) else {
        return;
    };
    let _ = (
        ip.dscp_ecn(),
        ip.ident(),
        ip.frag_offset(),
        ip.is_fragment(),
    );
    let _ = (ip.ttl(), ip.checksum(), ip.verify_checksum());
    let _ = Ipv4Repr::parse(&ip, ChecksumMode::Software);
    let Ok(repr) = Ipv4Repr::parse(&ip, ChecksumMode::Offload) else {
        return;
    };
    assert_eq!(repr.payload_len, ip.payload().len());
    match repr.protocol {
        ip_protocol::UDP => parse_udp(ip.payload(), repr.src_addr, repr.dst_addr),
        ip_protocol::ICMP => parse_icmp(ip.payload()),
        _ => {}
    }
}

fn parse_udp(bytes: &[u8], src: Ipv4Addr, dst: Ipv4Addr) {
    if let Ok(p) = UdpPacket::new_checked(bytes) {
        assert_eq!(p.payload().len() + UDP_HEADER_LEN, usize::from(p.len()));
        let _ = (
            p.src_port(),
            p.dst_port(),
            p.checksum(),
            p.verify_checksum(src, dst),
        );
        let _ = UdpRepr::parse(&p, src, dst, ChecksumMode::Software);
        UdpRepr::parse(&p, src, dst, ChecksumMode::Offload).unwrap();
    }
}

fn parse_icmp(bytes: &[u8]) {
    if let Ok(p) = Icmpv4Packet::new_checked(bytes) {
        let _ = (
            p.msg_type(),
            p.code(),
            p.echo_ident(),
            p.echo_seq_no(),
            p.data(),
        );
        let _ = Icmpv4Repr::parse(&p);
        let mut copy = bytes.to_vec();
        let mut p = Icmpv4Packet::new_checked(&mut copy[..]).unwrap();
        let _ = echo_request_to_reply_in_place(&mut p);
    }
}

fn arb_mac() -> impl Strategy<Value = EthernetAddress> {
    any::<[u8; 6]>().prop_map(EthernetAddress)
}

fn arb_ip() -> impl Strategy<Value = Ipv4Addr> {
    any::<[u8; 4]>().prop_map(Ipv4Addr::from)
}

fn arb_eth(ethertype: u16) -> impl Strategy<Value = EthernetRepr> {
    (arb_mac(), arb_mac(), proptest::option::of(0u16..0x1000)).prop_map(
        move |(src_addr, dst_addr, vlan_id)| EthernetRepr {
            src_addr,
            dst_addr,
            ethertype,
            vlan_id,
        },
    )
}

fn arb_ipv4(protocol: u8) -> impl Strategy<Value = Ipv4Repr> {
    (arb_ip(), arb_ip(), any::<u8>(), any::<u16>(), any::<bool>()).prop_map(
        move |(src_addr, dst_addr, ttl, ident, dont_frag)| Ipv4Repr {
            src_addr,
            dst_addr,
            protocol,
            payload_len: 0,
            ttl,
            ident,
            dont_frag,
        },
    )
}

fn arb_arp() -> impl Strategy<Value = ArpRepr> {
    let op = prop_oneof![
        Just(ArpOperation::Request),
        Just(ArpOperation::Reply),
        (3u16..).prop_map(ArpOperation::Unknown),
    ];
    (op, arb_mac(), arb_ip(), arb_mac(), arb_ip()).prop_map(|(operation, sha, spa, tha, tpa)| {
        ArpRepr {
            operation,
            source_hardware_addr: sha,
            source_protocol_addr: spa,
            target_hardware_addr: tha,
            target_protocol_addr: tpa,
        }
    })
}

/// Ethernet + IPv4 + UDP, emitted with the given checksum mode.
fn build_udp(
    eth: &EthernetRepr,
    ip: &Ipv4Repr,
    udp: &UdpRepr,
    payload: &[u8],
    mode: ChecksumMode,
) -> Vec<u8> {
    let ip = Ipv4Repr {
        payload_len: udp.buffer_len(payload.len()),
        ..*ip
    };
    let mut frame = vec![0u8; eth.header_len() + ip.buffer_len()];
    eth.emit(&mut frame).unwrap();
    let ip_buf = &mut frame[eth.header_len()..];
    ip.emit(ip_buf, mode).unwrap();
    let udp_buf = &mut ip_buf[IPV4_HEADER_LEN..];
    udp_buf[UDP_HEADER_LEN..].copy_from_slice(payload);
    udp.emit(udp_buf, payload.len(), ip.src_addr, ip.dst_addr, mode)
        .unwrap();
    frame
}

/// The host `classify` is fuzzed against.
const US: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);
const US_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

/// A UDP frame, or an ICMP echo or ARP frame, for the mutation fuzzer.
fn arb_valid_frame() -> impl Strategy<Value = Vec<u8>> {
    arb_frame(false)
}

/// `arb_valid_frame`; with `to_host`, addressed to `US` / `US_IP` (or
/// Ethernet broadcast) without a VLAN tag, so that the host's receive
/// path takes it past its first checks into ARP, ICMP and UDP.
fn arb_frame(to_host: bool) -> impl Strategy<Value = Vec<u8>> {
    let payload = proptest::collection::vec(any::<u8>(), 0..200);
    let eth = move |ethertype| {
        (arb_eth(ethertype), prop::bool::weighted(0.2)).prop_map(move |(mut eth, bcast)| {
            if to_host {
                eth.dst_addr = if bcast {
                    EthernetAddress::BROADCAST
                } else {
                    US
                };
                eth.vlan_id = None;
            }
            eth
        })
    };
    let ip = move |protocol| {
        arb_ipv4(protocol).prop_map(move |mut ip| {
            if to_host {
                ip.dst_addr = US_IP;
            }
            ip
        })
    };
    let udp = (
        eth(ether_type::IPV4),
        ip(ip_protocol::UDP),
        any::<(u16, u16)>(),
        payload.clone(),
    )
        .prop_map(|(eth, ip, (s, d), payload)| {
            let udp = UdpRepr {
                src_port: s,
                dst_port: d,
            };
            build_udp(&eth, &ip, &udp, &payload, ChecksumMode::Software)
        });
    let icmp = (
        eth(ether_type::IPV4),
        ip(ip_protocol::ICMP),
        any::<(u16, u16)>(),
        payload,
    )
        .prop_map(|(eth, ip, (ident, seq_no), data)| {
            let icmp = Icmpv4Repr::EchoRequest {
                ident,
                seq_no,
                data: &data,
            };
            let ip = Ipv4Repr {
                payload_len: icmp.buffer_len(),
                ..ip
            };
            let mut frame = vec![0u8; eth.header_len() + ip.buffer_len()];
            eth.emit(&mut frame).unwrap();
            ip.emit(&mut frame[eth.header_len()..], ChecksumMode::Software)
                .unwrap();
            icmp.emit(&mut frame[eth.header_len() + IPV4_HEADER_LEN..])
                .unwrap();
            frame
        });
    let arp = (eth(ether_type::ARP), arb_arp()).prop_map(move |(eth, mut arp)| {
        if to_host {
            arp.target_protocol_addr = US_IP;
        }
        let mut frame = vec![0u8; eth.header_len() + ARP_BUFFER_LEN];
        eth.emit(&mut frame).unwrap();
        arp.emit(&mut frame[eth.header_len()..]).unwrap();
        frame
    });
    prop_oneof![udp, icmp, arp]
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
        parse_chain(&bytes);
        // Each layer on its own too, since random bytes rarely get past Ethernet.
        parse_arp(&bytes);
        parse_ipv4(&bytes);
        parse_udp(&bytes, Ipv4Addr::LOCALHOST, Ipv4Addr::BROADCAST);
        parse_icmp(&bytes);
    }

    #[test]
    fn mutated_valid_frames_never_panic(
        frame in arb_valid_frame(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
        pad in 0usize..64,
    ) {
        let mut frame = frame;
        parse_chain(&frame);
        for (at, value) in edits {
            let i = at.index(frame.len());
            frame[i] = value;
        }
        parse_chain(&frame);
        parse_chain(&frame[..cut.index(frame.len() + 1)]);
        frame.resize(frame.len() + pad, 0);
        parse_chain(&frame);
    }

    /// The host's whole receive decision (`Host::classify`: ARP, ICMP
    /// echo, UDP demux, drops) on frames for it, mutated and cut: never a
    /// panic, and a reply always fits the frame it was written into.
    #[test]
    fn the_host_classifies_any_frame_without_panicking(
        frame in arb_frame(true),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        cut in proptest::option::weighted(0.2, any::<prop::sample::Index>()),
        offload in 0u8..3,
    ) {
        use stack::host::{Host, HostConfig, NeighbourTable, Verdict};
        use dpdk_ffi::{CsumStatus, RxChecksum};
        let status = [CsumStatus::Unknown, CsumStatus::Good, CsumStatus::Bad][offload as usize];
        let csum = RxChecksum { ip: status, l4: status };
        let mut host: Host<Vec<u8>> = Host::new(
            std::sync::Arc::new(HostConfig::new(US, US_IP, 24)),
            NeighbourTable::new(),
        );
        let mut counters = stack::counters::Counters::default();
        let now = std::time::Instant::now();
        let mut frame = frame;
        for (at, value) in edits {
            let i = at.index(frame.len());
            frame[i] = value;
        }
        if let Some(cut) = cut {
            frame.truncate(cut.index(frame.len() + 1));
        }
        match host.classify(&mut frame, csum, now, &mut counters) {
            Verdict::Reply { len } => prop_assert!(len <= frame.len()),
            Verdict::Udp(_) | Verdict::Consumed | Verdict::Drop(_) => {}
        }
    }

    #[test]
    fn udp_frame_round_trips(
        eth in arb_eth(ether_type::IPV4),
        ip in arb_ipv4(ip_protocol::UDP),
        ports in any::<(u16, u16)>(),
        payload in proptest::collection::vec(any::<u8>(), 0..1500),
        pad in 0usize..40,
    ) {
        let udp = UdpRepr { src_port: ports.0, dst_port: ports.1 };
        let mut frame = build_udp(&eth, &ip, &udp, &payload, ChecksumMode::Software);
        frame.resize(frame.len() + pad, 0); // Ethernet padding must be ignored.

        let f = EthernetFrame::new_checked(&frame[..]).unwrap();
        prop_assert_eq!(EthernetRepr::parse(&f).unwrap(), eth);
        let p = Ipv4Packet::new_checked(f.payload()).unwrap();
        prop_assert!(p.verify_checksum());
        let ip_back = Ipv4Repr::parse(&p, ChecksumMode::Software).unwrap();
        prop_assert_eq!(ip_back, Ipv4Repr { payload_len: payload.len() + 8, ..ip });
        let u = UdpPacket::new_checked(p.payload()).unwrap();
        prop_assert!(u.verify_checksum(ip.src_addr, ip.dst_addr));
        prop_assert_ne!(u.checksum(), 0);
        prop_assert_eq!(UdpRepr::parse(&u, ip.src_addr, ip.dst_addr, ChecksumMode::Software), Ok(udp));
        prop_assert_eq!(u.payload(), &payload[..]);
    }

    #[test]
    fn offload_fields_let_the_nic_finish(
        eth in arb_eth(ether_type::IPV4),
        ip in arb_ipv4(ip_protocol::UDP),
        ports in any::<(u16, u16)>(),
        payload in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let udp = UdpRepr { src_port: ports.0, dst_port: ports.1 };
        let soft = build_udp(&eth, &ip, &udp, &payload, ChecksumMode::Software);
        let mut hard = build_udp(&eth, &ip, &udp, &payload, ChecksumMode::Offload);
        let l3 = eth.header_len();
        let l4 = l3 + IPV4_HEADER_LEN;
        prop_assert_eq!(&hard[l3 + 10..l3 + 12], &[0u8, 0][..]);
        // Do what the NIC does: IP over the header; UDP over the datagram,
        // seeded by the pseudo-header sum left in the field; 0 goes as ffff.
        let ip_sum = checksum::finish(checksum::data(&hard[l3..l4]));
        hard[l3 + 10..l3 + 12].copy_from_slice(&ip_sum.to_be_bytes());
        let udp_sum = match checksum::finish(checksum::data(&hard[l4..])) {
            0 => 0xffff,
            v => v,
        };
        hard[l4 + 6..l4 + 8].copy_from_slice(&udp_sum.to_be_bytes());
        prop_assert_eq!(hard, soft);
    }

    #[test]
    fn icmp_echo_round_trips(
        eth in arb_eth(ether_type::IPV4),
        ip in arb_ipv4(ip_protocol::ICMP),
        ident in any::<u16>(),
        seq_no in any::<u16>(),
        reply in any::<bool>(),
        data in proptest::collection::vec(any::<u8>(), 0..1500),
    ) {
        let icmp = if reply {
            Icmpv4Repr::EchoReply { ident, seq_no, data: &data }
        } else {
            Icmpv4Repr::EchoRequest { ident, seq_no, data: &data }
        };
        let ip = Ipv4Repr { payload_len: icmp.buffer_len(), ..ip };
        let mut frame = vec![0u8; eth.header_len() + ip.buffer_len()];
        eth.emit(&mut frame).unwrap();
        ip.emit(&mut frame[eth.header_len()..], ChecksumMode::Software).unwrap();
        icmp.emit(&mut frame[eth.header_len() + IPV4_HEADER_LEN..]).unwrap();

        let f = EthernetFrame::new_checked(&frame[..]).unwrap();
        prop_assert_eq!(EthernetRepr::parse(&f).unwrap(), eth);
        let p = Ipv4Packet::new_checked(f.payload()).unwrap();
        prop_assert_eq!(Ipv4Repr::parse(&p, ChecksumMode::Software).unwrap(), ip);
        let c = Icmpv4Packet::new_checked(p.payload()).unwrap();
        prop_assert!(c.verify_checksum());
        prop_assert_eq!(Icmpv4Repr::parse(&c).unwrap(), icmp);
    }

    #[test]
    fn arp_frame_round_trips(eth in arb_eth(ether_type::ARP), arp in arb_arp(), pad in 0usize..32) {
        let mut frame = vec![0u8; eth.header_len() + ARP_BUFFER_LEN + pad];
        eth.emit(&mut frame).unwrap();
        arp.emit(&mut frame[eth.header_len()..]).unwrap();
        let f = EthernetFrame::new_checked(&frame[..]).unwrap();
        prop_assert_eq!(EthernetRepr::parse(&f).unwrap(), eth);
        let a = ArpPacket::new_checked(f.payload()).unwrap();
        prop_assert_eq!(ArpRepr::parse(&a).unwrap(), arp);
    }

    /// Flipping bits of one byte changes the sum by d or d * 256 with
    /// 0 < |d| < 256, never a multiple of 0xffff, so the one's complement sum
    /// always changes and the check fails. Two exceptions, both exact:
    /// - the checksum field turned into 0, which means "no checksum";
    /// - the length field, which also changes which bytes are summed; there
    ///   the receiver's check that it matches the IP payload length catches it.
    #[test]
    fn udp_single_byte_corruption_detected(
        src in arb_ip(),
        dst in arb_ip(),
        ports in any::<(u16, u16)>(),
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let udp = UdpRepr { src_port: ports.0, dst_port: ports.1 };
        let mut dgram = vec![0u8; UDP_HEADER_LEN + payload.len()];
        dgram[UDP_HEADER_LEN..].copy_from_slice(&payload);
        udp.emit(&mut dgram, payload.len(), src, dst, ChecksumMode::Software).unwrap();

        // Index space: 4 bytes of src, 4 of dst, then the datagram.
        let i = at.index(8 + dgram.len());
        let (mut s, mut d) = (src.octets(), dst.octets());
        match i {
            0..=3 => s[i] ^= flip,
            4..=7 => d[i - 4] ^= flip,
            _ => dgram[i - 8] ^= flip,
        }
        let (s, d) = (Ipv4Addr::from(s), Ipv4Addr::from(d));
        let ip_payload_len = dgram.len();
        let accepted = match UdpPacket::new_checked(&dgram[..]) {
            Ok(p) => usize::from(p.len()) == ip_payload_len && p.verify_checksum(s, d),
            Err(_) => false,
        };
        let checksum_field_zeroed = (14..16).contains(&i) && dgram[6..8] == [0, 0];
        prop_assert_eq!(accepted, checksum_field_zeroed);
        if !(12..14).contains(&i) {
            // Outside the length field, the checksum alone must catch it.
            let p = UdpPacket::new_checked(&dgram[..]).unwrap();
            prop_assert_eq!(p.verify_checksum(s, d), checksum_field_zeroed);
        }
    }
}
