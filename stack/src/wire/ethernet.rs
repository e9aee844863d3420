//! Ethernet II frames, with at most one 802.1Q tag.
//!
//! One tag covers the deployments this stack targets (a VLAN per tenant on a
//! trunk port). A second tag (QinQ) is not unwrapped: `vlan_id` is the outer
//! tag's and `ethertype` reports 0x8100, so the host drops the frame as of a
//! foreign VLAN, or as an unsupported EtherType when the outer id is its own.

use core::fmt;
use core::str::FromStr;

use super::{read_u16, write_u16, Error, Result};

/// Length of an untagged Ethernet II header.
pub const HEADER_LEN: usize = 14;
/// Length of a header carrying one 802.1Q tag.
pub const VLAN_HEADER_LEN: usize = 18;

/// EtherType values the stack dispatches on. Plain `u16`s rather than an enum
/// so unknown values pass through without a lossy conversion.
pub mod ether_type {
    /// Internet Protocol version 4.
    pub const IPV4: u16 = 0x0800;
    /// Address Resolution Protocol.
    pub const ARP: u16 = 0x0806;
    /// IEEE 802.1Q VLAN tag.
    pub const VLAN: u16 = 0x8100;
}

const DST: core::ops::Range<usize> = 0..6;
const SRC: core::ops::Range<usize> = 6..12;
const OUTER_TYPE: usize = 12;
const TCI: usize = 14;

/// A 48-bit MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    /// The all-ones address every station accepts.
    pub const BROADCAST: EthernetAddress = EthernetAddress([0xff; 6]);

    fn from_slice(bytes: &[u8]) -> Self {
        let mut a = [0u8; 6];
        a.copy_from_slice(bytes);
        EthernetAddress(a)
    }

    /// The address as bytes, in wire order.
    pub fn as_bytes(&self) -> &[u8; 6] {
        &self.0
    }

    /// Whether this is ff:ff:ff:ff:ff:ff.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Whether the group bit is set; broadcast is a multicast address too.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// Whether this names a single station: the only kind valid as a source.
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }
}

impl fmt::Display for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl FromStr for EthernetAddress {
    type Err = Error;

    /// Accepts six groups of one or two hex digits separated by ':' or '-',
    /// as configuration files and `ip link` write them.
    fn from_str(s: &str) -> Result<Self> {
        let sep = if s.contains('-') { '-' } else { ':' };
        let mut out = [0u8; 6];
        let mut groups = s.split(sep);
        for byte in out.iter_mut() {
            let g = groups.next().ok_or(Error::Malformed)?;
            // from_str_radix alone would also take a leading '+'.
            if g.is_empty() || g.len() > 2 || !g.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(Error::Malformed);
            }
            *byte = u8::from_str_radix(g, 16).map_err(|_| Error::Malformed)?;
        }
        if groups.next().is_some() {
            return Err(Error::Malformed);
        }
        Ok(EthernetAddress(out))
    }
}

/// A view of an Ethernet II frame in a byte buffer.
#[derive(Debug, Clone)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps a buffer without checks; getters may then panic on short
    /// buffers. For buffers the stack built itself.
    pub fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    /// Wraps a buffer, checking it holds the whole header (tag included).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let frame = Self::new_unchecked(buffer);
        let len = frame.buffer.as_ref().len();
        if len < HEADER_LEN || len < frame.header_len() {
            return Err(Error::Truncated);
        }
        Ok(frame)
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn is_tagged(&self) -> bool {
        read_u16(self.buffer.as_ref(), OUTER_TYPE) == ether_type::VLAN
    }

    /// 14, or 18 when the frame carries an 802.1Q tag.
    pub fn header_len(&self) -> usize {
        if self.is_tagged() {
            VLAN_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Destination MAC address.
    pub fn dst_addr(&self) -> EthernetAddress {
        EthernetAddress::from_slice(&self.buffer.as_ref()[DST])
    }

    /// Source MAC address.
    pub fn src_addr(&self) -> EthernetAddress {
        EthernetAddress::from_slice(&self.buffer.as_ref()[SRC])
    }

    /// The 12-bit VLAN id of the 802.1Q tag, if any. Priority bits are
    /// dropped: the stack does not act on them.
    pub fn vlan_id(&self) -> Option<u16> {
        self.is_tagged()
            .then(|| read_u16(self.buffer.as_ref(), TCI) & 0x0fff)
    }

    /// EtherType of the payload, i.e. the one after the tag if tagged.
    pub fn ethertype(&self) -> u16 {
        read_u16(self.buffer.as_ref(), self.header_len() - 2)
    }

    /// Everything after the header, including any padding.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination MAC address.
    pub fn set_dst_addr(&mut self, addr: EthernetAddress) {
        self.buffer.as_mut()[DST].copy_from_slice(&addr.0);
    }

    /// Sets the source MAC address.
    pub fn set_src_addr(&mut self, addr: EthernetAddress) {
        self.buffer.as_mut()[SRC].copy_from_slice(&addr.0);
    }

    /// Mutable access to everything after the header.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        &mut self.buffer.as_mut()[start..]
    }
}

/// The fields of an Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    pub src_addr: EthernetAddress,
    pub dst_addr: EthernetAddress,
    /// EtherType of the payload (never 0x8100: the tag is `vlan_id`).
    pub ethertype: u16,
    /// 802.1Q VLAN id, at most 0x0fff.
    pub vlan_id: Option<u16>,
}

impl EthernetRepr {
    /// Reads the header of a checked frame; every header is representable.
    pub fn parse<T: AsRef<[u8]>>(frame: &EthernetFrame<T>) -> Result<Self> {
        Ok(EthernetRepr {
            src_addr: frame.src_addr(),
            dst_addr: frame.dst_addr(),
            ethertype: frame.ethertype(),
            vlan_id: frame.vlan_id(),
        })
    }

    /// 14, or 18 with a VLAN tag.
    pub fn header_len(&self) -> usize {
        if self.vlan_id.is_some() {
            VLAN_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Writes the header into the first `header_len()` bytes of `buf`.
    ///
    /// Errors: `Truncated` if `buf` is shorter than the header, `Malformed`
    /// if the VLAN id does not fit 12 bits or if `ethertype` is 0x8100
    /// without a `vlan_id`. Nothing is written on error.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() < self.header_len() {
            return Err(Error::Truncated);
        }
        // An untagged header with EtherType 0x8100 would read back as tagged.
        let untagged_vlan = self.vlan_id.is_none() && self.ethertype == ether_type::VLAN;
        if untagged_vlan || self.vlan_id.is_some_and(|id| id > 0x0fff) {
            return Err(Error::Malformed);
        }
        buf[DST].copy_from_slice(&self.dst_addr.0);
        buf[SRC].copy_from_slice(&self.src_addr.0);
        match self.vlan_id {
            Some(id) => {
                write_u16(buf, OUTER_TYPE, ether_type::VLAN);
                write_u16(buf, TCI, id);
                write_u16(buf, TCI + 2, self.ethertype);
            }
            None => write_u16(buf, OUTER_TYPE, self.ethertype),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNTAGGED: [u8; 18] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // dst
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, // src
        0x08, 0x06, // ARP
        0xaa, 0xbb, 0xcc, 0xdd, // payload
    ];

    const TAGGED: [u8; 20] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, // dst
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, // src
        0x81, 0x00, 0xa0, 0x64, // 802.1Q, PCP 5, VLAN 100
        0x08, 0x00, // IPv4
        0x45, 0x00, // payload
    ];

    #[test]
    fn parse_untagged() {
        let f = EthernetFrame::new_checked(&UNTAGGED[..]).unwrap();
        assert_eq!(f.dst_addr(), EthernetAddress::BROADCAST);
        assert_eq!(
            f.src_addr(),
            EthernetAddress([0x52, 0x54, 0, 0x12, 0x34, 0x56])
        );
        assert_eq!(f.ethertype(), ether_type::ARP);
        assert_eq!(f.vlan_id(), None);
        assert_eq!(f.header_len(), 14);
        assert_eq!(f.payload(), &[0xaa, 0xbb, 0xcc, 0xdd]);
    }

    #[test]
    fn parse_vlan_tagged() {
        let f = EthernetFrame::new_checked(&TAGGED[..]).unwrap();
        assert_eq!(f.vlan_id(), Some(100));
        assert_eq!(f.ethertype(), ether_type::IPV4);
        assert_eq!(f.header_len(), 18);
        assert_eq!(f.payload(), &[0x45, 0x00]);
        let r = EthernetRepr::parse(&f).unwrap();
        assert_eq!(r.vlan_id, Some(100));
        assert_eq!(r.ethertype, ether_type::IPV4);
    }

    #[test]
    fn truncated_at_every_length() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                EthernetFrame::new_checked(&UNTAGGED[..n]).err(),
                Some(Error::Truncated)
            );
        }
        for n in 0..VLAN_HEADER_LEN {
            assert_eq!(
                EthernetFrame::new_checked(&TAGGED[..n]).err(),
                Some(Error::Truncated)
            );
        }
        assert!(EthernetFrame::new_checked(&UNTAGGED[..14]).is_ok());
        assert!(EthernetFrame::new_checked(&TAGGED[..18]).is_ok());
    }

    #[test]
    fn emit_round_trips() {
        for vlan_id in [None, Some(0), Some(100), Some(0x0fff)] {
            let repr = EthernetRepr {
                src_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
                dst_addr: EthernetAddress::BROADCAST,
                ethertype: ether_type::ARP,
                vlan_id,
            };
            let mut buf = vec![0u8; repr.header_len() + 3];
            repr.emit(&mut buf).unwrap();
            let f = EthernetFrame::new_checked(&buf[..]).unwrap();
            assert_eq!(EthernetRepr::parse(&f).unwrap(), repr);
            assert_eq!(f.payload().len(), 3);
        }
    }

    #[test]
    fn emit_rejects_bad_input() {
        let mut repr = EthernetRepr {
            src_addr: EthernetAddress::default(),
            dst_addr: EthernetAddress::default(),
            ethertype: ether_type::IPV4,
            vlan_id: Some(5),
        };
        assert_eq!(repr.emit(&mut [0u8; 17]), Err(Error::Truncated));
        repr.vlan_id = Some(0x1000);
        assert_eq!(repr.emit(&mut [0u8; 18]), Err(Error::Malformed));
        repr.vlan_id = None;
        repr.ethertype = ether_type::VLAN;
        assert_eq!(repr.emit(&mut [0u8; 18]), Err(Error::Malformed));
    }

    #[test]
    fn setters_and_payload_mut() {
        let mut buf = TAGGED;
        let mut f = EthernetFrame::new_checked(&mut buf[..]).unwrap();
        f.set_dst_addr(EthernetAddress([1, 2, 3, 4, 5, 6]));
        f.set_src_addr(EthernetAddress([6, 5, 4, 3, 2, 1]));
        f.payload_mut()[0] = 0x46;
        let buf = f.into_inner();
        assert_eq!(&buf[..12], &[1, 2, 3, 4, 5, 6, 6, 5, 4, 3, 2, 1]);
        assert_eq!(buf[18], 0x46);
    }

    #[test]
    fn address_classes() {
        let b = EthernetAddress::BROADCAST;
        assert!(b.is_broadcast() && b.is_multicast() && !b.is_unicast());
        let m = EthernetAddress([0x01, 0x00, 0x5e, 0, 0, 1]);
        assert!(!m.is_broadcast() && m.is_multicast() && !m.is_unicast());
        let u = EthernetAddress([0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        assert!(!u.is_broadcast() && !u.is_multicast() && u.is_unicast());
    }

    #[test]
    fn address_text_round_trip() {
        let a = EthernetAddress([0x52, 0x54, 0x00, 0x0a, 0xbc, 0xff]);
        assert_eq!(a.to_string(), "52:54:00:0a:bc:ff");
        assert_eq!("52:54:00:0a:bc:ff".parse::<EthernetAddress>(), Ok(a));
        assert_eq!("52-54-0-A-BC-FF".parse::<EthernetAddress>(), Ok(a));
        for bad in [
            "",
            "52:54:00:0a:bc",
            "52:54:00:0a:bc:ff:00",
            "52:54:00:0a:bc:fff",
            "52:54:00:0a:bc:+f",
            "52:54:00:0a::ff",
            "52:54:00:0a:bc:fg",
            "52-54:00:0a:bc:ff",
        ] {
            assert_eq!(
                bad.parse::<EthernetAddress>(),
                Err(Error::Malformed),
                "{bad}"
            );
        }
    }
}
