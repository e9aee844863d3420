//! ARP for IPv4 over Ethernet (RFC 826).
//!
//! Only the Ethernet/IPv4 combination exists on the links this stack drives,
//! so the address lengths are fixed and anything else is `Malformed`: the
//! views can then use constant offsets instead of trusting hlen/plen.

use std::net::Ipv4Addr;

use super::ethernet::{ether_type, EthernetAddress};
use super::{read_ipv4, read_u16, write_ipv4, write_u16, Error, Result};

/// Length of an Ethernet/IPv4 ARP packet.
pub const BUFFER_LEN: usize = 28;

const HTYPE: usize = 0;
const PTYPE: usize = 2;
const HLEN: usize = 4;
const PLEN: usize = 5;
const OPER: usize = 6;
const SHA: core::ops::Range<usize> = 8..14;
const SPA: usize = 14;
const THA: core::ops::Range<usize> = 18..24;
const TPA: usize = 24;

const HTYPE_ETHERNET: u16 = 1;

/// ARP opcode; unknown values are kept so they can be counted and dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOperation {
    Request,
    Reply,
    Unknown(u16),
}

impl From<u16> for ArpOperation {
    fn from(v: u16) -> Self {
        match v {
            1 => ArpOperation::Request,
            2 => ArpOperation::Reply,
            other => ArpOperation::Unknown(other),
        }
    }
}

impl From<ArpOperation> for u16 {
    fn from(op: ArpOperation) -> u16 {
        match op {
            ArpOperation::Request => 1,
            ArpOperation::Reply => 2,
            ArpOperation::Unknown(v) => v,
        }
    }
}

/// A view of an ARP packet in a byte buffer.
#[derive(Debug, Clone)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// Wraps a buffer without checks; getters may then panic on short buffers.
    pub fn new_unchecked(buffer: T) -> Self {
        ArpPacket { buffer }
    }

    /// Wraps a buffer holding an Ethernet/IPv4 ARP packet. Trailing bytes
    /// (Ethernet padding to 60 bytes) are allowed.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let packet = Self::new_unchecked(buffer);
        if packet.buffer.as_ref().len() < BUFFER_LEN {
            return Err(Error::Truncated);
        }
        if !packet.is_ethernet_ipv4() {
            return Err(Error::Malformed);
        }
        Ok(packet)
    }

    fn is_ethernet_ipv4(&self) -> bool {
        self.hardware_type() == HTYPE_ETHERNET
            && self.protocol_type() == ether_type::IPV4
            && self.hardware_len() == 6
            && self.protocol_len() == 4
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Hardware type (1 for Ethernet).
    pub fn hardware_type(&self) -> u16 {
        read_u16(self.buffer.as_ref(), HTYPE)
    }

    /// Protocol type (0x0800 for IPv4).
    pub fn protocol_type(&self) -> u16 {
        read_u16(self.buffer.as_ref(), PTYPE)
    }

    /// Hardware address length.
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[HLEN]
    }

    /// Protocol address length.
    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[PLEN]
    }

    /// Opcode.
    pub fn operation(&self) -> ArpOperation {
        read_u16(self.buffer.as_ref(), OPER).into()
    }

    /// Sender MAC address.
    pub fn source_hardware_addr(&self) -> EthernetAddress {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[SHA]);
        EthernetAddress(a)
    }

    /// Sender IPv4 address.
    pub fn source_protocol_addr(&self) -> Ipv4Addr {
        read_ipv4(self.buffer.as_ref(), SPA)
    }

    /// Target MAC address (zero in a request).
    pub fn target_hardware_addr(&self) -> EthernetAddress {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[THA]);
        EthernetAddress(a)
    }

    /// Target IPv4 address.
    pub fn target_protocol_addr(&self) -> Ipv4Addr {
        read_ipv4(self.buffer.as_ref(), TPA)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ArpPacket<T> {
    /// Writes the fixed Ethernet/IPv4 htype, ptype, hlen and plen.
    pub fn set_ethernet_ipv4(&mut self) {
        let buf = self.buffer.as_mut();
        write_u16(buf, HTYPE, HTYPE_ETHERNET);
        write_u16(buf, PTYPE, ether_type::IPV4);
        buf[HLEN] = 6;
        buf[PLEN] = 4;
    }

    /// Sets the opcode.
    pub fn set_operation(&mut self, op: ArpOperation) {
        write_u16(self.buffer.as_mut(), OPER, op.into());
    }

    /// Sets the sender MAC address.
    pub fn set_source_hardware_addr(&mut self, addr: EthernetAddress) {
        self.buffer.as_mut()[SHA].copy_from_slice(&addr.0);
    }

    /// Sets the sender IPv4 address.
    pub fn set_source_protocol_addr(&mut self, addr: Ipv4Addr) {
        write_ipv4(self.buffer.as_mut(), SPA, addr);
    }

    /// Sets the target MAC address.
    pub fn set_target_hardware_addr(&mut self, addr: EthernetAddress) {
        self.buffer.as_mut()[THA].copy_from_slice(&addr.0);
    }

    /// Sets the target IPv4 address.
    pub fn set_target_protocol_addr(&mut self, addr: Ipv4Addr) {
        write_ipv4(self.buffer.as_mut(), TPA, addr);
    }
}

/// The fields of an Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRepr {
    pub operation: ArpOperation,
    pub source_hardware_addr: EthernetAddress,
    pub source_protocol_addr: Ipv4Addr,
    pub target_hardware_addr: EthernetAddress,
    pub target_protocol_addr: Ipv4Addr,
}

impl ArpRepr {
    /// Reads a packet; `Malformed` unless it is Ethernet/IPv4 ARP (checked
    /// again here because the packet may come from `new_unchecked`).
    pub fn parse<T: AsRef<[u8]>>(packet: &ArpPacket<T>) -> Result<Self> {
        if !packet.is_ethernet_ipv4() {
            return Err(Error::Malformed);
        }
        Ok(ArpRepr {
            operation: packet.operation(),
            source_hardware_addr: packet.source_hardware_addr(),
            source_protocol_addr: packet.source_protocol_addr(),
            target_hardware_addr: packet.target_hardware_addr(),
            target_protocol_addr: packet.target_protocol_addr(),
        })
    }

    /// Always `BUFFER_LEN`.
    pub fn buffer_len(&self) -> usize {
        BUFFER_LEN
    }

    /// Writes the packet into the first 28 bytes of `buf`; `Truncated` if
    /// `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() < BUFFER_LEN {
            return Err(Error::Truncated);
        }
        let mut p = ArpPacket::new_unchecked(buf);
        p.set_ethernet_ipv4();
        p.set_operation(self.operation);
        p.set_source_hardware_addr(self.source_hardware_addr);
        p.set_source_protocol_addr(self.source_protocol_addr);
        p.set_target_hardware_addr(self.target_hardware_addr);
        p.set_target_protocol_addr(self.target_protocol_addr);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "who-has 192.0.2.1 tell 192.0.2.10" as Linux sends it.
    const REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, // htype ptype hlen plen oper
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0xc0, 0x00, 0x02, 0x0a, // sender
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc0, 0x00, 0x02, 0x01, // target
    ];

    fn request_repr() -> ArpRepr {
        ArpRepr {
            operation: ArpOperation::Request,
            source_hardware_addr: EthernetAddress([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]),
            source_protocol_addr: Ipv4Addr::new(192, 0, 2, 10),
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: Ipv4Addr::new(192, 0, 2, 1),
        }
    }

    #[test]
    fn parse_real_request() {
        let p = ArpPacket::new_checked(&REQUEST[..]).unwrap();
        assert_eq!(p.operation(), ArpOperation::Request);
        assert_eq!(ArpRepr::parse(&p).unwrap(), request_repr());
    }

    #[test]
    fn padded_request_is_fine() {
        let mut padded = REQUEST.to_vec();
        padded.resize(46, 0);
        let p = ArpPacket::new_checked(&padded[..]).unwrap();
        assert_eq!(ArpRepr::parse(&p).unwrap(), request_repr());
    }

    #[test]
    fn emit_matches_capture() {
        let mut buf = [0xeeu8; 28];
        request_repr().emit(&mut buf).unwrap();
        assert_eq!(buf, REQUEST);
        assert_eq!(request_repr().emit(&mut [0u8; 27]), Err(Error::Truncated));
    }

    #[test]
    fn reply_round_trips() {
        let mut repr = request_repr();
        repr.operation = ArpOperation::Reply;
        repr.target_hardware_addr = EthernetAddress([2, 0, 0, 0, 0, 1]);
        let mut buf = [0u8; BUFFER_LEN];
        repr.emit(&mut buf).unwrap();
        let p = ArpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(ArpRepr::parse(&p).unwrap(), repr);
        assert_eq!(repr.buffer_len(), 28);
    }

    #[test]
    fn truncated_at_every_length() {
        for n in 0..BUFFER_LEN {
            assert_eq!(
                ArpPacket::new_checked(&REQUEST[..n]).err(),
                Some(Error::Truncated)
            );
        }
    }

    #[test]
    fn other_link_or_protocol_is_malformed() {
        for (at, value) in [(1, 6), (2, 0x86), (4, 8), (5, 16)] {
            let mut buf = REQUEST;
            buf[at] = value;
            assert_eq!(
                ArpPacket::new_checked(&buf[..]).err(),
                Some(Error::Malformed)
            );
            let unchecked = ArpPacket::new_unchecked(&buf[..]);
            assert_eq!(ArpRepr::parse(&unchecked), Err(Error::Malformed));
        }
    }

    #[test]
    fn unknown_operation_is_kept() {
        let mut buf = REQUEST;
        buf[7] = 9;
        let p = ArpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(
            ArpRepr::parse(&p).unwrap().operation,
            ArpOperation::Unknown(9)
        );
        assert_eq!(u16::from(ArpOperation::Unknown(9)), 9);
    }
}
