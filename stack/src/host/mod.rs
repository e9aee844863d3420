//! Host logic: what a frame means to us. `Host::classify` looks at one
//! received frame in place and says what to do with it: hand a UDP payload
//! up, send the frame back (it rewrote an ARP request or ICMP echo request
//! into the reply in place), or drop it for a counted reason. The builders
//! write the headers of outgoing UDP and ARP frames. Pure byte work: the
//! DPDK backend wraps it around mbufs, tests around plain buffers.

pub mod config;
pub mod neighbour;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Instant;

use dpdk_ffi::{CsumStatus, RxChecksum};

pub use config::HostConfig;
pub use neighbour::{NeighbourCache, NeighbourConfig, NeighbourTable, Resolve};

use crate::counters::{Counters, DropReason};
use crate::wire::{
    self, icmpv4_type, ArpOperation, ArpPacket, ArpRepr, ChecksumMode, EthernetAddress,
    EthernetFrame, EthernetRepr, Icmpv4Packet, Ipv4Packet, Ipv4Repr, UdpPacket, UdpRepr,
};

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const IP_PROTO_ICMP: u8 = 1;
const IP_PROTO_UDP: u8 = 17;
/// Echo replies kept for the pinger between its polls; more are dropped.
const MAX_ECHO_REPLIES: usize = 64;
/// Ethernet frames are padded to this length (without FCS).
pub const MIN_FRAME: usize = 60;

/// Where a received UDP payload sits in its frame and whom it is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpMeta {
    pub payload_offset: usize,
    pub payload_len: usize,
    pub peer: SocketAddrV4,
    pub local_port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Udp(UdpMeta),
    /// The frame was rewritten in place into a reply of `len` bytes: send it.
    Reply {
        len: usize,
    },
    /// Handled; nothing to send (an ARP reply we learned from, say).
    Consumed,
    Drop(DropReason),
}

/// An ICMP echo reply that reached us (an answer to our own ping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EchoReply {
    pub from: Ipv4Addr,
    pub ident: u16,
    pub seq: u16,
    /// ICMP data bytes.
    pub data_len: usize,
}

/// How the port handles checksums on transmit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxOffload {
    pub ip_checksum: bool,
    pub udp_checksum: bool,
}

/// One lcore's host state. `P` is how a packet waiting for ARP is held.
pub struct Host<P> {
    cfg: Arc<HostConfig>,
    neighbours: NeighbourCache<P>,
    /// Packets whose next hop just resolved, with its MAC: the caller
    /// fills in the destination and sends them.
    released: Vec<(EthernetAddress, P)>,
    ident: u16,
    echo_replies: Vec<EchoReply>,
}

impl<P> Host<P> {
    pub fn new(cfg: Arc<HostConfig>, table: Arc<NeighbourTable>) -> Host<P> {
        for (ip, mac) in &cfg.static_neighbours {
            table.add_static(*ip, *mac);
        }
        let neighbours = NeighbourCache::new(table, cfg.neighbour);
        Host {
            cfg,
            neighbours,
            released: Vec::new(),
            ident: 0,
            echo_replies: Vec::new(),
        }
    }

    /// Echo replies received since the last call (at most 64 are kept).
    pub fn take_echo_replies(&mut self) -> std::vec::Drain<'_, EchoReply> {
        self.echo_replies.drain(..)
    }

    pub fn config(&self) -> &HostConfig {
        &self.cfg
    }

    pub fn neighbours(&mut self) -> &mut NeighbourCache<P> {
        &mut self.neighbours
    }

    /// Ethernet (+VLAN) + IPv4 + UDP header bytes in front of a payload.
    pub fn udp_header_len(&self) -> usize {
        self.eth_header_len() + wire::IPV4_HEADER_LEN + wire::UDP_HEADER_LEN
    }

    pub fn eth_header_len(&self) -> usize {
        wire::ETHERNET_HEADER_LEN + if self.cfg.vlan.is_some() { 4 } else { 0 }
    }

    /// Up to `max` of the packets whose next hop resolved, oldest first;
    /// the rest wait for the next call (the caller's tx batch is smaller
    /// than the ARP queues).
    pub fn take_released(&mut self, max: usize) -> std::vec::Drain<'_, (EthernetAddress, P)> {
        let n = max.min(self.released.len());
        self.released.drain(..n)
    }

    /// Whether packets whose next hop resolved still wait to be sent.
    pub fn has_released(&self) -> bool {
        !self.released.is_empty()
    }

    /// Moves the packets waiting for addresses another lcore resolved
    /// since to the released ones.
    pub fn collect_resolved(&mut self, now: Instant, counters: &mut Counters) {
        for (mac, packets) in self.neighbours.take_resolved(now) {
            self.release(mac, packets, counters);
        }
    }

    /// Released packets wait for the tx queue, at most `queue_total` of
    /// them (what the ARP queues hold): past that, with a device that
    /// takes nothing, they are dropped as `TxFull`.
    fn release(&mut self, mac: EthernetAddress, packets: Vec<P>, counters: &mut Counters) {
        for p in packets {
            if self.released.len() < self.cfg.neighbour.queue_total {
                self.released.push((mac, p));
            } else {
                counters.drop(DropReason::TxFull);
            }
        }
    }

    /// Decide what `frame` means; may rewrite it in place into a reply.
    pub fn classify(
        &mut self,
        frame: &mut [u8],
        csum: RxChecksum,
        now: Instant,
        counters: &mut Counters,
    ) -> Verdict {
        let (src, dst, vlan, ethertype, l2_len) = match EthernetFrame::new_checked(&frame[..]) {
            Ok(eth) => (
                eth.src_addr(),
                eth.dst_addr(),
                eth.vlan_id(),
                eth.ethertype(),
                eth.header_len(),
            ),
            Err(e) => return Verdict::Drop(reason_of(e)),
        };
        if dst != self.cfg.mac && !dst.is_broadcast() {
            return Verdict::Drop(DropReason::ForeignMac);
        }
        // Replies go back to the source MAC: a group one would flood them.
        if !src.is_unicast() {
            return Verdict::Drop(DropReason::BadSource);
        }
        // VLAN id 0 is a priority tag, not a VLAN (802.1Q): frames from
        // hosts or switches that tag for priority are for the untagged LAN.
        if vlan.filter(|&id| id != 0) != self.cfg.vlan {
            return Verdict::Drop(DropReason::WrongVlan);
        }
        match ethertype {
            ETHERTYPE_ARP => self.on_arp(frame, l2_len, now, counters),
            ETHERTYPE_IPV4 if dst.is_broadcast() => Verdict::Drop(DropReason::NotForUs),
            ETHERTYPE_IPV4 => self.on_ipv4(frame, l2_len, csum, counters),
            _ => Verdict::Drop(DropReason::UnsupportedEtherType),
        }
    }

    fn on_arp(
        &mut self,
        frame: &mut [u8],
        l2_len: usize,
        now: Instant,
        counters: &mut Counters,
    ) -> Verdict {
        let repr = match ArpPacket::new_checked(&frame[l2_len..]).and_then(|p| ArpRepr::parse(&p)) {
            Ok(r) => r,
            Err(e) => return Verdict::Drop(reason_of(e)),
        };
        let for_us = repr.target_protocol_addr == self.cfg.ip;
        let from = repr.source_protocol_addr;
        let known = self.neighbours.lookup(from, now).is_some();
        // Learn from anything aimed at us, and refresh what we already know
        // (gratuitous ARP): RFC 826's merge rule; but only a unicast host
        // of our subnet (anything else is reached through the gateway, and
        // a host spraying made-up senders would fill the table).
        let mac = repr.source_hardware_addr;
        let neighbour = self.cfg.in_subnet(from)
            && self.cfg.reserved_in_subnet(from).is_none()
            && !from.is_multicast()
            && !from.is_broadcast()
            && mac.is_unicast();
        if (for_us || known) && neighbour && !from.is_unspecified() && from != self.cfg.ip {
            let waiting = self.neighbours.learn(from, mac, now);
            self.release(mac, waiting, counters);
        }
        if !for_us {
            return if known {
                Verdict::Consumed
            } else {
                Verdict::Drop(DropReason::NotForUs)
            };
        }
        if repr.operation != ArpOperation::Request {
            return Verdict::Consumed;
        }
        // The reply goes to the sender's hardware address.
        if !repr.source_hardware_addr.is_unicast() {
            return Verdict::Drop(DropReason::BadSource);
        }
        counters.arp_requests_in += 1;
        let reply = ArpRepr {
            operation: ArpOperation::Reply,
            source_hardware_addr: self.cfg.mac,
            source_protocol_addr: self.cfg.ip,
            target_hardware_addr: repr.source_hardware_addr,
            target_protocol_addr: repr.source_protocol_addr,
        };
        let len = self.write_arp(frame, repr.source_hardware_addr, &reply);
        counters.arp_replies_out += 1;
        Verdict::Reply { len }
    }

    fn on_ipv4(
        &mut self,
        frame: &mut [u8],
        l2_len: usize,
        csum: RxChecksum,
        counters: &mut Counters,
    ) -> Verdict {
        let ip = match Ipv4Packet::new_checked(&frame[l2_len..]) {
            Ok(ip) => ip,
            Err(e) => return Verdict::Drop(reason_of(e)),
        };
        let ip_ok = match csum.ip {
            CsumStatus::Good | CsumStatus::None => true,
            CsumStatus::Bad => false,
            CsumStatus::Unknown => ip.verify_checksum(),
        };
        if !ip_ok {
            return Verdict::Drop(DropReason::BadChecksum);
        }
        if ip.is_fragment() {
            return Verdict::Drop(DropReason::Fragmented);
        }
        let (src, dst, protocol, l3_len) =
            (ip.src_addr(), ip.dst_addr(), ip.protocol(), ip.header_len());
        if dst != self.cfg.ip {
            return Verdict::Drop(DropReason::NotForUs);
        }
        if self.is_martian(src) {
            return Verdict::Drop(DropReason::BadSource);
        }
        let l4 = l2_len + l3_len;
        match protocol {
            IP_PROTO_UDP => {
                let total = l2_len + ip.total_len() as usize;
                let udp = match UdpPacket::new_checked(&frame[l4..total]) {
                    Ok(u) => u,
                    Err(e) => return Verdict::Drop(reason_of(e)),
                };
                let udp_ok = match csum.l4 {
                    CsumStatus::Good | CsumStatus::None => true,
                    CsumStatus::Bad => false,
                    CsumStatus::Unknown => udp.verify_checksum(src, dst),
                };
                if !udp_ok {
                    return Verdict::Drop(DropReason::BadChecksum);
                }
                // Port 0 cannot be answered (RFC 768: "no reply port").
                if udp.src_port() == 0 {
                    return Verdict::Drop(DropReason::BadSource);
                }
                counters.udp_in += 1;
                Verdict::Udp(UdpMeta {
                    payload_offset: l4 + wire::UDP_HEADER_LEN,
                    payload_len: udp.len() as usize - wire::UDP_HEADER_LEN,
                    peer: SocketAddrV4::new(src, udp.src_port()),
                    local_port: udp.dst_port(),
                })
            }
            IP_PROTO_ICMP => self.on_icmp(frame, l2_len, counters),
            _ => Verdict::Drop(DropReason::UnsupportedProtocol),
        }
    }

    /// A source address no host on the link can have (RFC 1122 3.2.1.3):
    /// answering it would flood the link (broadcast), reach a group, or
    /// loop back to us.
    fn is_martian(&self, src: Ipv4Addr) -> bool {
        src.is_unspecified()
            || src.is_loopback()
            || src.is_multicast()
            || self.cfg.is_broadcast(src)
            || src == self.cfg.ip
    }

    /// Echo requests become replies in place: addresses swapped, type 0,
    /// checksums updated; the payload is not touched.
    fn on_icmp(&mut self, frame: &mut [u8], l2_len: usize, counters: &mut Counters) -> Verdict {
        let mut ip = Ipv4Packet::new_unchecked(&mut frame[l2_len..]);
        let total = ip.total_len() as usize;
        let from = ip.src_addr();
        {
            let mut icmp = match Icmpv4Packet::new_checked(&mut ip.payload_mut()[..]) {
                Ok(p) => p,
                Err(e) => return Verdict::Drop(reason_of(e)),
            };
            if !icmp.verify_checksum() {
                return Verdict::Drop(DropReason::BadChecksum);
            }
            if icmp.msg_type() == icmpv4_type::ECHO_REPLY && icmp.code() == 0 {
                if self.echo_replies.len() < MAX_ECHO_REPLIES {
                    self.echo_replies.push(EchoReply {
                        from,
                        ident: icmp.echo_ident(),
                        seq: icmp.echo_seq_no(),
                        data_len: icmp.data().len(),
                    });
                }
                return Verdict::Consumed;
            }
            if icmp.msg_type() != icmpv4_type::ECHO_REQUEST || icmp.code() != 0 {
                counters.icmp_other_in += 1;
                return Verdict::Consumed;
            }
            if wire::echo_request_to_reply_in_place(&mut icmp).is_err() {
                return Verdict::Drop(DropReason::Malformed);
            }
        }
        ip.swap_addrs();
        ip.set_ttl(self.cfg.ttl);
        ip.fill_checksum();
        let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
        let peer_mac = eth.src_addr();
        eth.set_dst_addr(peer_mac);
        eth.set_src_addr(self.cfg.mac);
        counters.icmp_echo_replies += 1;
        Verdict::Reply {
            len: (l2_len + total).max(MIN_FRAME.min(frame.len())),
        }
    }

    /// Write our Ethernet header (with our VLAN tag) for an IPv4 frame to
    /// `dst_mac`; returns its length and the packet's IPv4 identification.
    fn start_ipv4_frame(&mut self, frame: &mut [u8], dst_mac: EthernetAddress) -> (usize, u16) {
        let l2 = self.eth_header_len();
        EthernetRepr {
            src_addr: self.cfg.mac,
            dst_addr: dst_mac,
            ethertype: ETHERTYPE_IPV4,
            vlan_id: self.cfg.vlan,
        }
        .emit(&mut frame[..l2])
        .expect("our VLAN id was validated");
        self.ident = self.ident.wrapping_add(1);
        (l2, self.ident)
    }

    /// Write an ICMP echo request to `dst` (`data_len` data bytes, a byte
    /// pattern) into `frame`, for the next hop `dst_mac`; checksums in
    /// software (NICs do not offload ICMP). Returns the frame length
    /// (padded to 60 bytes); `frame` must hold `echo_request_len`.
    pub fn write_echo_request(
        &mut self,
        frame: &mut [u8],
        dst_mac: EthernetAddress,
        dst: Ipv4Addr,
        ident: u16,
        seq: u16,
        data_len: usize,
    ) -> usize {
        let (l2, ip_ident) = self.start_ipv4_frame(frame, dst_mac);
        let icmp_len = wire::ICMPV4_HEADER_LEN + data_len;
        Ipv4Repr {
            src_addr: self.cfg.ip,
            dst_addr: dst,
            protocol: IP_PROTO_ICMP,
            payload_len: icmp_len,
            ttl: self.cfg.ttl,
            ident: ip_ident,
            dont_frag: true,
        }
        .emit(&mut frame[l2..], ChecksumMode::Software)
        .expect("the frame holds the echo request");
        let l4 = l2 + wire::IPV4_HEADER_LEN;
        let data = &mut frame[l4 + wire::ICMPV4_HEADER_LEN..l4 + icmp_len];
        for (i, b) in data.iter_mut().enumerate() {
            *b = i as u8;
        }
        let mut icmp = Icmpv4Packet::new_unchecked(&mut frame[l4..l4 + icmp_len]);
        icmp.set_msg_type(icmpv4_type::ECHO_REQUEST);
        icmp.set_code(0);
        icmp.set_echo_ident(ident);
        icmp.set_echo_seq_no(seq);
        icmp.fill_checksum();
        let len = (l4 + icmp_len).max(MIN_FRAME);
        frame[l4 + icmp_len..len].fill(0);
        len
    }

    /// Bytes `write_echo_request` needs for `data_len` data bytes.
    pub fn echo_request_len(&self, data_len: usize) -> usize {
        (self.eth_header_len() + wire::IPV4_HEADER_LEN + wire::ICMPV4_HEADER_LEN + data_len)
            .max(MIN_FRAME)
    }

    /// Write an ARP frame (our VLAN, padded to 60 bytes) into `buf`.
    fn write_arp(&self, buf: &mut [u8], dst: EthernetAddress, arp: &ArpRepr) -> usize {
        let eth = EthernetRepr {
            src_addr: self.cfg.mac,
            dst_addr: dst,
            ethertype: ETHERTYPE_ARP,
            vlan_id: self.cfg.vlan,
        };
        let l2 = eth.header_len();
        // Pad to the Ethernet minimum where the buffer allows (a request
        // turned into a reply in place may be shorter; NICs pad on tx).
        let len = (l2 + wire::ARP_BUFFER_LEN).max(MIN_FRAME.min(buf.len()));
        let buf = &mut buf[..len];
        buf.fill(0);
        eth.emit(&mut buf[..l2]).expect("our VLAN id was validated");
        arp.emit(&mut buf[l2..]).expect("room for an ARP packet");
        len
    }

    /// Write a broadcast ARP request for `target` into `buf` (>= 64 bytes).
    /// With `target` == our address it is a gratuitous ARP announcing us.
    pub fn write_arp_request(&self, buf: &mut [u8], target: Ipv4Addr) -> usize {
        let req = ArpRepr {
            operation: ArpOperation::Request,
            source_hardware_addr: self.cfg.mac,
            source_protocol_addr: self.cfg.ip,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: target,
        };
        self.write_arp(buf, EthernetAddress::BROADCAST, &req)
    }

    /// Write Ethernet/IPv4/UDP headers in front of the payload that already
    /// sits at `frame[udp_header_len()..]`. The destination MAC is written
    /// later by `set_dst_mac` when it must wait for ARP.
    pub fn write_udp_headers(
        &mut self,
        frame: &mut [u8],
        dst_mac: EthernetAddress,
        peer: SocketAddrV4,
        src_port: u16,
        offload: TxOffload,
    ) {
        let payload_len = frame.len() - self.udp_header_len();
        let (l2, ident) = self.start_ipv4_frame(frame, dst_mac);
        let ip = Ipv4Repr {
            src_addr: self.cfg.ip,
            dst_addr: *peer.ip(),
            protocol: IP_PROTO_UDP,
            payload_len: wire::UDP_HEADER_LEN + payload_len,
            ttl: self.cfg.ttl,
            ident,
            dont_frag: true,
        };
        let ip_mode = if offload.ip_checksum {
            ChecksumMode::Offload
        } else {
            ChecksumMode::Software
        };
        ip.emit(&mut frame[l2..], ip_mode)
            .expect("the frame holds headers and payload");
        let udp_mode = if offload.udp_checksum {
            ChecksumMode::Offload
        } else {
            ChecksumMode::Software
        };
        let l4 = l2 + wire::IPV4_HEADER_LEN;
        UdpRepr {
            src_port,
            dst_port: peer.port(),
        }
        .emit(
            &mut frame[l4..],
            payload_len,
            self.cfg.ip,
            *peer.ip(),
            udp_mode,
        )
        .expect("the frame holds headers and payload");
    }

    /// Turn a received UDP frame (our VLAN, checked by `classify`) into the
    /// reply to its sender, payload untouched: MACs, addresses and ports
    /// swapped, our TTL. Swapping keeps both checksums valid (the sums do
    /// not depend on word order); the TTL change is applied incrementally.
    pub fn turn_around(&self, frame: &mut [u8]) {
        // The received header: a priority-tagged frame keeps its tag.
        let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
        let l2 = eth.header_len();
        let sender = eth.src_addr();
        eth.set_dst_addr(sender);
        eth.set_src_addr(self.cfg.mac);
        let mut ip = Ipv4Packet::new_unchecked(&mut frame[l2..]);
        let l3 = ip.header_len();
        let old_ttl = u16::from_be_bytes([ip.ttl(), ip.protocol()]);
        let new_ttl = u16::from_be_bytes([self.cfg.ttl, ip.protocol()]);
        let udp_len = UdpPacket::new_unchecked(&ip.payload_mut()[..]).len();
        // Bytes a sender put after the UDP datagram are not sent back.
        let (old_len, new_len) = (ip.total_len(), l3 as u16 + udp_len);
        ip.swap_addrs();
        ip.set_ttl(self.cfg.ttl);
        ip.set_total_len(new_len);
        let sum = wire::checksum::update(ip.checksum(), old_ttl, new_ttl);
        ip.set_checksum(wire::checksum::update(sum, old_len, new_len));
        UdpPacket::new_unchecked(&mut frame[l2 + l3..]).swap_ports();
    }

    /// Fill in the destination MAC of a frame built earlier.
    pub fn set_dst_mac(frame: &mut [u8], mac: EthernetAddress) {
        EthernetFrame::new_unchecked(frame).set_dst_addr(mac);
    }
}

fn reason_of(e: wire::Error) -> DropReason {
    match e {
        wire::Error::Truncated => DropReason::Truncated,
        wire::Error::Malformed => DropReason::Malformed,
        wire::Error::Checksum => DropReason::BadChecksum,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ether_type, Icmpv4Repr, UdpPacket};

    const US: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);
    const PEER: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 9]);
    const US_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 9);
    const UNKNOWN: RxChecksum = RxChecksum {
        ip: CsumStatus::Unknown,
        l4: CsumStatus::Unknown,
    };

    fn host() -> Host<Vec<u8>> {
        Host::new(
            Arc::new(HostConfig::new(US, US_IP, 24)),
            NeighbourTable::new(),
        )
    }

    fn eth(dst: EthernetAddress, ethertype: u16, vlan: Option<u16>, payload: &[u8]) -> Vec<u8> {
        let repr = EthernetRepr {
            src_addr: PEER,
            dst_addr: dst,
            ethertype,
            vlan_id: vlan,
        };
        let mut f = vec![0u8; repr.header_len() + payload.len()];
        repr.emit(&mut f).unwrap();
        f[repr.header_len()..].copy_from_slice(payload);
        f
    }

    fn ipv4(protocol: u8, l4: &[u8]) -> Vec<u8> {
        ipv4_from(PEER_IP, protocol, l4)
    }

    fn ipv4_from(src: Ipv4Addr, protocol: u8, l4: &[u8]) -> Vec<u8> {
        let repr = Ipv4Repr {
            src_addr: src,
            dst_addr: US_IP,
            protocol,
            payload_len: l4.len(),
            ttl: 64,
            ident: 1,
            dont_frag: true,
        };
        let mut p = vec![0u8; 20 + l4.len()];
        p[20..].copy_from_slice(l4);
        repr.emit(&mut p, ChecksumMode::Software).unwrap();
        p
    }

    fn udp(payload: &[u8], dst_port: u16) -> Vec<u8> {
        udp_from(SocketAddrV4::new(PEER_IP, 5555), payload, dst_port)
    }

    fn udp_from(src: SocketAddrV4, payload: &[u8], dst_port: u16) -> Vec<u8> {
        let mut u = vec![0u8; 8 + payload.len()];
        u[8..].copy_from_slice(payload);
        UdpRepr {
            src_port: src.port(),
            dst_port,
        }
        .emit(
            &mut u,
            payload.len(),
            *src.ip(),
            US_IP,
            ChecksumMode::Software,
        )
        .unwrap();
        u
    }

    fn echo_request() -> Vec<u8> {
        let req = Icmpv4Repr::EchoRequest {
            ident: 7,
            seq_no: 3,
            data: b"abcdefgh0123456789",
        };
        let mut icmp = vec![0u8; req.buffer_len()];
        req.emit(&mut icmp).unwrap();
        icmp
    }

    /// Nothing from a source no host can have is delivered or answered:
    /// a reply would flood the link, reach a group, or come back to us.
    #[test]
    fn datagrams_and_pings_from_impossible_sources_are_dropped() {
        let mut h = host();
        let mut c = Counters::default();
        let martians = [
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::LOCALHOST,
            Ipv4Addr::new(224, 0, 0, 5),
            Ipv4Addr::BROADCAST,
            Ipv4Addr::new(10, 0, 0, 255),
            US_IP,
        ];
        for src in martians {
            let from = SocketAddrV4::new(src, 5555);
            for mut f in [
                eth(
                    US,
                    ether_type::IPV4,
                    None,
                    &ipv4_from(src, 17, &udp_from(from, b"x", 7)),
                ),
                eth(
                    US,
                    ether_type::IPV4,
                    None,
                    &ipv4_from(src, 1, &echo_request()),
                ),
            ] {
                let v = classify(&mut h, &mut f, &mut c);
                assert_eq!(v, Verdict::Drop(DropReason::BadSource), "from {src}");
            }
        }
        let port_zero = udp_from(SocketAddrV4::new(PEER_IP, 0), b"x", 7);
        let mut f = eth(US, ether_type::IPV4, None, &ipv4(17, &port_zero));
        assert_eq!(
            classify(&mut h, &mut f, &mut c),
            Verdict::Drop(DropReason::BadSource)
        );
        // A group source MAC, on an otherwise good ping.
        let mut f = eth(US, ether_type::IPV4, None, &ipv4(1, &echo_request()));
        f[6] |= 1;
        assert_eq!(
            classify(&mut h, &mut f, &mut c),
            Verdict::Drop(DropReason::BadSource)
        );
        assert_eq!((c.udp_in, c.icmp_echo_replies), (0, 0));
        // The same from a host's address is delivered and answered.
        let mut f = eth(US, ether_type::IPV4, None, &ipv4(1, &echo_request()));
        assert!(matches!(
            classify(&mut h, &mut f, &mut c),
            Verdict::Reply { .. }
        ));
    }

    fn classify(h: &mut Host<Vec<u8>>, f: &mut [u8], c: &mut Counters) -> Verdict {
        h.classify(f, UNKNOWN, Instant::now(), c)
    }

    #[test]
    fn udp_payload_is_located_and_its_sender_named() {
        let mut h = host();
        let mut c = Counters::default();
        let mut f = eth(US, ether_type::IPV4, None, &ipv4(17, &udp(b"hello", 7)));
        f.extend_from_slice(&[0; 4]); // Ethernet padding after the IP packet
        let Verdict::Udp(m) = classify(&mut h, &mut f, &mut c) else {
            panic!("not delivered");
        };
        assert_eq!(
            &f[m.payload_offset..m.payload_offset + m.payload_len],
            b"hello"
        );
        assert_eq!(m.peer, SocketAddrV4::new(PEER_IP, 5555));
        assert_eq!(m.local_port, 7);
        assert_eq!(c.udp_in, 1);
    }

    /// A broadcast "who has US_IP" frame from `mac` / `ip`.
    fn arp_request_for_us(mac: EthernetAddress, ip: Ipv4Addr) -> Vec<u8> {
        let mut arp = vec![0u8; 28];
        ArpRepr {
            operation: ArpOperation::Request,
            source_hardware_addr: mac,
            source_protocol_addr: ip,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: US_IP,
        }
        .emit(&mut arp)
        .unwrap();
        eth(EthernetAddress::BROADCAST, ether_type::ARP, None, &arp)
    }

    #[test]
    fn arp_request_for_us_becomes_a_reply_and_teaches_us_the_sender() {
        let mut h = host();
        let mut c = Counters::default();
        let mut f = arp_request_for_us(PEER, PEER_IP);
        let Verdict::Reply { len } = classify(&mut h, &mut f, &mut c) else {
            panic!("no reply");
        };
        let frame = EthernetFrame::new_checked(&f[..len]).unwrap();
        assert_eq!(frame.dst_addr(), PEER);
        assert_eq!(frame.src_addr(), US);
        let reply = ArpRepr::parse(&ArpPacket::new_checked(frame.payload()).unwrap()).unwrap();
        assert_eq!(reply.operation, ArpOperation::Reply);
        assert_eq!(reply.source_hardware_addr, US);
        assert_eq!(reply.source_protocol_addr, US_IP);
        assert_eq!(reply.target_protocol_addr, PEER_IP);
        assert_eq!(h.neighbours().lookup(PEER_IP, Instant::now()), Some(PEER));
        assert_eq!((c.arp_requests_in, c.arp_replies_out), (1, 1));
    }

    #[test]
    fn checksums_the_nic_verified_without_a_valid_field_are_accepted() {
        // virtio's CKSUM_NONE: the field holds a partial sum, the data was
        // verified. Software verification would drop every such frame.
        let mut f = eth(US, ether_type::IPV4, None, &ipv4(17, &udp(b"partial", 7)));
        let udp_checksum_at = 14 + 20 + 6; // Ethernet, IPv4 (no options), UDP ports + length
        f[udp_checksum_at] ^= 0x33;
        let mut h = host();
        let mut c = Counters::default();
        let verified = RxChecksum {
            ip: CsumStatus::None,
            l4: CsumStatus::None,
        };
        assert!(matches!(
            h.classify(&mut f.clone(), verified, Instant::now(), &mut c),
            Verdict::Udp(_)
        ));
        assert!(matches!(
            h.classify(&mut f, UNKNOWN, Instant::now(), &mut c),
            Verdict::Drop(DropReason::BadChecksum)
        ));
    }

    /// Packets released by resolutions wait until the caller has room,
    /// oldest first, and no more than the ARP queues hold in all.
    #[test]
    fn released_packets_are_taken_as_room_allows_and_bounded() {
        let mut cfg = HostConfig::new(US, US_IP, 24);
        cfg.neighbour.queue_per_addr = 3;
        cfg.neighbour.queue_total = 4;
        let mut h: Host<Vec<u8>> = Host::new(Arc::new(cfg), NeighbourTable::new());
        let mut c = Counters::default();
        let now = Instant::now();
        let other = Ipv4Addr::new(10, 0, 0, 10);
        for (ip, first) in [(PEER_IP, 0u8), (other, 10)] {
            for k in 0..3 {
                h.neighbours().enqueue(ip, vec![first + k], now);
            }
            // Nothing is taken in between: the second release finds 3 waiting.
            classify(&mut h, &mut arp_request_for_us(PEER, ip), &mut c);
        }
        assert_eq!(c.dropped(DropReason::TxFull), 2, "4 of 6 kept");
        let first: Vec<u8> = h.take_released(2).map(|(_, p)| p[0]).collect();
        assert_eq!(first, [0, 1]);
        assert!(h.has_released());
        let rest: Vec<u8> = h.take_released(10).map(|(_, p)| p[0]).collect();
        assert_eq!(rest, [2, 10]);
        assert!(!h.has_released());
    }

    #[test]
    fn arp_from_outside_the_subnet_is_answered_and_from_a_group_address_dropped_none_learned() {
        let mut h = host();
        let mut c = Counters::default();
        let senders = [
            (PEER, Ipv4Addr::new(192, 168, 7, 7)),
            (PEER, Ipv4Addr::new(10, 0, 0, 255)),
            (PEER, Ipv4Addr::new(10, 0, 0, 0)),
            (EthernetAddress([0x01, 0, 0x5e, 0, 0, 9]), PEER_IP),
            (EthernetAddress::BROADCAST, PEER_IP),
        ];
        for (mac, ip) in senders {
            let mut f = arp_request_for_us(mac, ip);
            let v = classify(&mut h, &mut f, &mut c);
            match mac.is_unicast() {
                true => assert!(matches!(v, Verdict::Reply { .. }), "{mac} {ip}: {v:?}"),
                // Its reply would go to the group.
                false => assert_eq!(v, Verdict::Drop(DropReason::BadSource), "{mac} {ip}"),
            }
            assert_eq!(
                h.neighbours().lookup(ip, Instant::now()),
                None,
                "{mac} {ip}"
            );
        }
        assert!(h.neighbours().table().is_empty());
    }

    /// ICMP that is neither echo request nor reply (here port
    /// unreachable) is taken and counted, and answered by nothing.
    #[test]
    fn other_icmp_is_taken_and_counted() {
        let mut icmp = vec![0u8; 8 + 28];
        icmp[0] = icmpv4_type::DST_UNREACHABLE;
        icmp[1] = 3;
        Icmpv4Packet::new_unchecked(&mut icmp[..]).fill_checksum();
        let mut f = eth(US, ether_type::IPV4, None, &ipv4(1, &icmp));
        let mut c = Counters::default();
        assert_eq!(classify(&mut host(), &mut f, &mut c), Verdict::Consumed);
        assert_eq!((c.icmp_other_in, c.icmp_echo_replies), (1, 0));
    }

    #[test]
    fn echo_request_becomes_a_valid_echo_reply_in_place() {
        let mut h = host();
        let mut c = Counters::default();
        let mut f = eth(US, ether_type::IPV4, None, &ipv4(1, &echo_request()));
        let Verdict::Reply { len } = classify(&mut h, &mut f, &mut c) else {
            panic!("no reply");
        };
        let frame = EthernetFrame::new_checked(&f[..len]).unwrap();
        assert_eq!((frame.dst_addr(), frame.src_addr()), (PEER, US));
        let ip = Ipv4Packet::new_checked(frame.payload()).unwrap();
        assert!(ip.verify_checksum());
        assert_eq!((ip.src_addr(), ip.dst_addr()), (US_IP, PEER_IP));
        let icmp = Icmpv4Packet::new_checked(ip.payload()).unwrap();
        assert!(icmp.verify_checksum());
        assert_eq!(
            Icmpv4Repr::parse(&icmp).unwrap(),
            Icmpv4Repr::EchoReply {
                ident: 7,
                seq_no: 3,
                data: b"abcdefgh0123456789"
            }
        );
        assert_eq!(c.icmp_echo_replies, 1);
    }

    /// Our echo request, answered by another host, comes back to us as an
    /// `EchoReply` with its identifier and sequence number.
    #[test]
    fn our_echo_request_is_answered_and_the_reply_recorded() {
        let mut us = host();
        let peer_cfg = HostConfig::new(PEER, PEER_IP, 24);
        let mut peer: Host<Vec<u8>> = Host::new(Arc::new(peer_cfg), NeighbourTable::new());
        let mut c = Counters::default();
        for data_len in [0, 18, 56, 1000] {
            let mut f = vec![0u8; us.echo_request_len(data_len)];
            let len = us.write_echo_request(&mut f, PEER, PEER_IP, 0x4242, 9, data_len);
            assert_eq!(len, f.len());
            let Verdict::Reply { len } = classify(&mut peer, &mut f, &mut c) else {
                panic!("the peer does not answer our {data_len}-byte request");
            };
            assert_eq!(classify(&mut us, &mut f[..len], &mut c), Verdict::Consumed);
            let got: Vec<EchoReply> = us.take_echo_replies().collect();
            assert_eq!(
                got,
                [EchoReply {
                    from: PEER_IP,
                    ident: 0x4242,
                    seq: 9,
                    data_len,
                }],
                "{data_len} data bytes"
            );
        }
        // Beyond the bound, replies are not kept.
        for seq in 0..100 {
            let mut f = vec![0u8; us.echo_request_len(8)];
            us.write_echo_request(&mut f, PEER, PEER_IP, 1, seq, 8);
            let Verdict::Reply { len } = classify(&mut peer, &mut f, &mut c) else {
                panic!("no reply");
            };
            classify(&mut us, &mut f[..len], &mut c);
        }
        assert_eq!(us.take_echo_replies().count(), MAX_ECHO_REPLIES);
    }

    #[test]
    fn bad_frames_are_dropped_for_the_right_reason() {
        let good = eth(US, ether_type::IPV4, None, &ipv4(17, &udp(b"x", 7)));
        let mut cases: Vec<(&str, Vec<u8>, DropReason)> = vec![
            ("runt", good[..10].to_vec(), DropReason::Truncated),
            ("ip truncated", good[..30].to_vec(), DropReason::Truncated),
            (
                "foreign mac",
                eth(PEER, ether_type::IPV4, None, &ipv4(17, &udp(b"x", 7))),
                DropReason::ForeignMac,
            ),
            (
                "vlan we are not on",
                eth(US, ether_type::IPV4, Some(5), &ipv4(17, &udp(b"x", 7))),
                DropReason::WrongVlan,
            ),
            (
                "ipv6",
                eth(US, 0x86dd, None, &[0u8; 40]),
                DropReason::UnsupportedEtherType,
            ),
            (
                "tcp",
                eth(US, ether_type::IPV4, None, &ipv4(6, &[0u8; 20])),
                DropReason::UnsupportedProtocol,
            ),
        ];
        let mut bad_ip_csum = good.clone();
        bad_ip_csum[14 + 10] ^= 0xff;
        cases.push(("ip checksum", bad_ip_csum, DropReason::BadChecksum));
        let mut bad_udp_csum = good.clone();
        let last = bad_udp_csum.len() - 1;
        bad_udp_csum[last] ^= 0x01;
        cases.push(("udp checksum", bad_udp_csum, DropReason::BadChecksum));
        let mut version6 = good.clone();
        version6[14] = 0x65;
        cases.push(("ip version", version6, DropReason::Malformed));
        let mut frag = good.clone();
        {
            let mut ip = Ipv4Packet::new_unchecked(&mut frag[14..]);
            ip.set_flags_and_frag_offset(false, true, 0);
            ip.fill_checksum();
        }
        cases.push(("fragment", frag, DropReason::Fragmented));
        let mut other_ip = good.clone();
        {
            let mut ip = Ipv4Packet::new_unchecked(&mut other_ip[14..]);
            ip.set_dst_addr(Ipv4Addr::new(10, 0, 0, 3));
            ip.fill_checksum();
        }
        UdpPacket::new_unchecked(&mut other_ip[34..])
            .fill_checksum(PEER_IP, Ipv4Addr::new(10, 0, 0, 3));
        cases.push(("not our ip", other_ip, DropReason::NotForUs));

        for (name, mut f, want) in cases {
            let mut h = host();
            let mut c = Counters::default();
            assert_eq!(
                classify(&mut h, &mut f, &mut c),
                Verdict::Drop(want),
                "{name}"
            );
        }
    }

    /// Also for a priority-tagged frame (VLAN id 0, kept in the reply) and
    /// one whose IP packet carries bytes after the UDP datagram (not sent
    /// back: the reply's IP length is the datagram's).
    #[test]
    fn a_frame_turned_around_is_a_valid_reply_to_its_sender() {
        for (tag, trailing) in [(None, 0), (Some(0), 0), (None, 5), (Some(0), 3)] {
            let case = format!("tag {tag:?}, {trailing} trailing bytes");
            let mut h = host();
            let mut c = Counters::default();
            let mut l4 = udp(b"ping", 7);
            l4.extend(std::iter::repeat_n(0xee, trailing));
            let mut f = eth(US, ether_type::IPV4, tag, &ipv4(17, &l4));
            let l2 = EthernetFrame::new_checked(&f[..]).unwrap().header_len();
            // A TTL other than ours, so the incremental update is exercised.
            {
                let mut ip = Ipv4Packet::new_unchecked(&mut f[l2..]);
                ip.set_ttl(3);
                ip.fill_checksum();
            }
            let Verdict::Udp(meta) = classify(&mut h, &mut f, &mut c) else {
                panic!("{case}: not delivered");
            };
            assert_eq!(
                &f[meta.payload_offset..][..meta.payload_len],
                b"ping",
                "{case}"
            );
            // What the backend sends: the headers and the payload.
            f.truncate(meta.payload_offset + meta.payload_len);
            h.turn_around(&mut f);
            let frame = EthernetFrame::new_checked(&f[..]).unwrap();
            assert_eq!((frame.dst_addr(), frame.src_addr()), (PEER, US), "{case}");
            assert_eq!(frame.vlan_id(), tag, "{case}");
            let ip = Ipv4Packet::new_checked(frame.payload()).unwrap();
            assert!(
                ip.verify_checksum(),
                "{case}: IPv4 checksum after the TTL change"
            );
            assert_eq!(ip.total_len() as usize, frame.payload().len(), "{case}");
            assert_eq!(
                (ip.src_addr(), ip.dst_addr(), ip.ttl()),
                (US_IP, PEER_IP, 64),
                "{case}"
            );
            let udp = UdpPacket::new_checked(ip.payload()).unwrap();
            assert!(udp.verify_checksum(US_IP, PEER_IP), "{case}");
            assert_eq!(
                (udp.src_port(), udp.dst_port(), udp.payload()),
                (7, 5555, &b"ping"[..]),
                "{case}"
            );
        }
    }

    /// Priority-tagged frames (VLAN id 0) are for the untagged LAN; a host
    /// on a VLAN takes its own tag only.
    #[test]
    fn priority_tagged_frames_are_taken_as_untagged() {
        let mut c = Counters::default();
        let mut f = eth(US, ether_type::IPV4, Some(0), &ipv4(1, &echo_request()));
        assert!(matches!(
            classify(&mut host(), &mut f, &mut c),
            Verdict::Reply { .. }
        ));
        let mut f = eth(US, ether_type::IPV4, Some(0), &ipv4(17, &udp(b"x", 7)));
        assert!(matches!(
            classify(&mut host(), &mut f, &mut c),
            Verdict::Udp(_)
        ));
        let mut cfg = HostConfig::new(US, US_IP, 24);
        cfg.vlan = Some(5);
        let mut on_vlan: Host<Vec<u8>> = Host::new(Arc::new(cfg), NeighbourTable::new());
        for tag in [None, Some(0), Some(6)] {
            let mut f = eth(US, ether_type::IPV4, tag, &ipv4(17, &udp(b"x", 7)));
            let v = classify(&mut on_vlan, &mut f, &mut c);
            assert_eq!(v, Verdict::Drop(DropReason::WrongVlan), "{tag:?}");
        }
    }

    #[test]
    fn built_udp_frames_parse_back_with_valid_checksums() {
        let mut h = host();
        let payload = b"the payload";
        let hdr = h.udp_header_len();
        let mut f = vec![0u8; hdr + payload.len()];
        f[hdr..].copy_from_slice(payload);
        let peer = SocketAddrV4::new(PEER_IP, 9000);
        h.write_udp_headers(&mut f, PEER, peer, 4433, TxOffload::default());
        let frame = EthernetFrame::new_checked(&f[..]).unwrap();
        assert_eq!((frame.dst_addr(), frame.src_addr()), (PEER, US));
        let ip = Ipv4Packet::new_checked(frame.payload()).unwrap();
        assert!(ip.verify_checksum() && ip.dont_frag());
        let udp = UdpPacket::new_checked(ip.payload()).unwrap();
        assert!(udp.verify_checksum(US_IP, PEER_IP));
        assert_eq!((udp.src_port(), udp.dst_port()), (4433, 9000));
        assert_eq!(udp.payload(), payload);
    }
}
