//! UDP over IPv4 (RFC 768).
//!
//! The length field, not the buffer, bounds the datagram: a buffer that runs
//! longer (an IP payload with trailing bytes) is accepted and the extra bytes
//! are ignored, as Linux does.

use std::net::Ipv4Addr;

use super::ipv4::ip_protocol;
use super::{checksum, read_u16, write_u16, ChecksumMode, Error, Result};

/// Length of the UDP header.
pub const HEADER_LEN: usize = 8;

const SRC_PORT: usize = 0;
const DST_PORT: usize = 2;
const LENGTH: usize = 4;
const CHECKSUM: usize = 6;

/// The value to leave in the checksum field when the NIC finishes it.
///
/// DPDK's UDP checksum offload expects the folded, *non-inverted* sum of the
/// pseudo-header (what `rte_ipv4_phdr_cksum` returns) and adds the rest.
pub fn pseudo_header_checksum(src_addr: Ipv4Addr, dst_addr: Ipv4Addr, udp_len: u16) -> u16 {
    checksum::pseudo_header_v4(src_addr, dst_addr, ip_protocol::UDP, udp_len)
}

/// A view of a UDP datagram in a byte buffer.
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

// `len` is the wire field's name; an `is_empty` would mean nothing here.
#[allow(clippy::len_without_is_empty)]
impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps a buffer without checks; getters may then panic on short buffers.
    pub fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Wraps a buffer after checking `8 <= length field <= buffer length`.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let packet = Self::new_unchecked(buffer);
        let buf_len = packet.buffer.as_ref().len();
        if buf_len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let len = usize::from(packet.len());
        if len < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if len > buf_len {
            return Err(Error::Truncated);
        }
        Ok(packet)
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), SRC_PORT)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), DST_PORT)
    }

    /// Length field: header plus payload.
    pub fn len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), LENGTH)
    }

    /// Checksum field (0: the sender computed none).
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), CHECKSUM)
    }

    /// The datagram as the length field bounds it, clamped to the buffer so
    /// that a setter breaking the invariant cannot cause a panic.
    fn datagram(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        &buf[..usize::from(self.len()).min(buf.len())]
    }

    /// Bytes after the header, up to the length field.
    pub fn payload(&self) -> &[u8] {
        let d = self.datagram();
        &d[HEADER_LEN.min(d.len())..]
    }

    /// Whether the checksum is correct for these IP addresses. A zero field
    /// means "not computed", which IPv4 allows, and is accepted.
    pub fn verify_checksum(&self, src_addr: Ipv4Addr, dst_addr: Ipv4Addr) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        checksum::verify_with_pseudo_header_v4(
            src_addr,
            dst_addr,
            ip_protocol::UDP,
            self.datagram(),
        )
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), SRC_PORT, value);
    }

    /// Sets the destination port.
    pub fn set_dst_port(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), DST_PORT, value);
    }

    /// Sets the length field; keep it within the buffer.
    pub fn set_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), LENGTH, value);
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), CHECKSUM, value);
    }

    /// Exchanges the ports, to answer in place; like `Ipv4Packet::swap_addrs`
    /// this leaves the checksum valid.
    pub fn swap_ports(&mut self) {
        let (src, dst) = (self.src_port(), self.dst_port());
        self.set_src_port(dst);
        self.set_dst_port(src);
    }

    /// Computes the checksum in software and stores it. A result of 0 is
    /// sent as 0xffff (the same value in one's complement), because 0 on the
    /// wire would mean "no checksum".
    pub fn fill_checksum(&mut self, src_addr: Ipv4Addr, dst_addr: Ipv4Addr) {
        self.set_checksum(0);
        let pseudo = pseudo_header_checksum(src_addr, dst_addr, self.len());
        let sum = checksum::combine(&[pseudo, checksum::data(self.datagram())]);
        let value = match checksum::finish(sum) {
            0 => 0xffff,
            v => v,
        };
        self.set_checksum(value);
    }

    /// Mutable bytes after the header, up to the length field.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let buf_len = self.buffer.as_ref().len();
        let end = usize::from(self.len()).min(buf_len);
        let start = HEADER_LEN.min(end);
        &mut self.buffer.as_mut()[start..end]
    }
}

/// The UDP header fields that are not derived from the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    pub src_port: u16,
    pub dst_port: u16,
}

impl UdpRepr {
    /// Reads the ports. With `ChecksumMode::Software` a wrong checksum is
    /// `Checksum`; `Offload` trusts the caller to have checked the NIC's
    /// verdict. Lengths are re-checked in case the packet is unchecked.
    pub fn parse<T: AsRef<[u8]>>(
        packet: &UdpPacket<T>,
        src_addr: Ipv4Addr,
        dst_addr: Ipv4Addr,
        mode: ChecksumMode,
    ) -> Result<Self> {
        let buf_len = packet.buffer.as_ref().len();
        if buf_len < HEADER_LEN || usize::from(packet.len()) > buf_len {
            return Err(Error::Truncated);
        }
        if usize::from(packet.len()) < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if mode == ChecksumMode::Software && !packet.verify_checksum(src_addr, dst_addr) {
            return Err(Error::Checksum);
        }
        Ok(UdpRepr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
        })
    }

    /// Always `HEADER_LEN`.
    pub fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Header plus payload.
    pub fn buffer_len(&self, payload_len: usize) -> usize {
        HEADER_LEN.saturating_add(payload_len)
    }

    /// Writes the header into `buf`, whose payload (`payload_len` bytes after
    /// the header) must already be in place since the checksum covers it.
    ///
    /// `Offload` stores `pseudo_header_checksum` for the NIC to complete.
    /// Errors: `Malformed` if the length exceeds 65535, `Truncated` if `buf`
    /// is shorter than header plus payload.
    pub fn emit(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        src_addr: Ipv4Addr,
        dst_addr: Ipv4Addr,
        mode: ChecksumMode,
    ) -> Result<()> {
        let len = u16::try_from(self.buffer_len(payload_len)).map_err(|_| Error::Malformed)?;
        let buf = buf.get_mut(..usize::from(len)).ok_or(Error::Truncated)?;
        let pseudo = pseudo_header_checksum(src_addr, dst_addr, len);
        let value = match mode {
            // The header is summed from the values and only the payload is
            // read from `buf`: loads of bytes just stored stall on store
            // forwarding.
            ChecksumMode::Software => {
                let header = u64::from(self.src_port) + u64::from(self.dst_port) + u64::from(len);
                let payload = u64::from(checksum::data(&buf[HEADER_LEN..]));
                let sum = checksum::fold(payload + header + u64::from(pseudo));
                match checksum::finish(sum) {
                    0 => 0xffff, // 0 means "no checksum" in UDP over IPv4
                    c => c,
                }
            }
            ChecksumMode::Offload => pseudo,
        };
        let mut p = UdpPacket::new_unchecked(buf);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(len);
        p.set_checksum(value);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::UDP_DNS_QUERY;

    const SRC: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
    const DST: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 53);

    fn datagram() -> Vec<u8> {
        UDP_DNS_QUERY[20..].to_vec()
    }

    #[test]
    fn parse_real_dns_query() {
        let buf = datagram();
        let p = UdpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port(), p.len()), (54321, 53, 37));
        assert_eq!(p.checksum(), 0xc55b);
        assert!(p.verify_checksum(SRC, DST));
        assert!(!p.verify_checksum(SRC, Ipv4Addr::new(192, 0, 2, 54)));
        assert_eq!(p.payload(), &UDP_DNS_QUERY[28..]);
        let repr = UdpRepr::parse(&p, SRC, DST, ChecksumMode::Software).unwrap();
        assert_eq!(
            repr,
            UdpRepr {
                src_port: 54321,
                dst_port: 53
            }
        );
    }

    #[test]
    fn emit_matches_capture() {
        let mut buf = datagram();
        buf[..8].fill(0);
        let repr = UdpRepr {
            src_port: 54321,
            dst_port: 53,
        };
        repr.emit(&mut buf, 29, SRC, DST, ChecksumMode::Software)
            .unwrap();
        assert_eq!(buf, datagram());
        assert_eq!(
            repr.emit(&mut buf, 30, SRC, DST, ChecksumMode::Software),
            Err(Error::Truncated)
        );
        let mut big = vec![0u8; 70_000];
        assert_eq!(
            repr.emit(&mut big, 65_528, SRC, DST, ChecksumMode::Software),
            Err(Error::Malformed)
        );
    }

    #[test]
    fn offload_leaves_pseudo_header_sum() {
        let mut buf = datagram();
        let repr = UdpRepr {
            src_port: 54321,
            dst_port: 53,
        };
        repr.emit(&mut buf, 29, SRC, DST, ChecksumMode::Offload)
            .unwrap();
        let p = UdpPacket::new_checked(&buf[..]).unwrap();
        // c000+020a+c000+0235+0011+0025 = 1_8475 -> 8476, not inverted.
        assert_eq!(p.checksum(), 0x8476);
        // What the NIC does: sum everything (field included), invert.
        let nic = checksum::finish(checksum::data(&buf));
        assert_eq!(nic, 0xc55b);
    }

    #[test]
    fn truncated_and_malformed_lengths() {
        let buf = datagram();
        for n in 0..buf.len() {
            assert_eq!(
                UdpPacket::new_checked(&buf[..n]).err(),
                Some(Error::Truncated),
                "length {n}"
            );
        }
        let mut bad = datagram();
        bad[5] = 7;
        assert_eq!(
            UdpPacket::new_checked(&bad[..]).err(),
            Some(Error::Malformed)
        );
        let unchecked = UdpPacket::new_unchecked(&bad[..]);
        assert_eq!(
            UdpRepr::parse(&unchecked, SRC, DST, ChecksumMode::Offload),
            Err(Error::Malformed)
        );
    }

    #[test]
    fn length_field_bounds_payload() {
        let mut buf = datagram();
        buf.extend_from_slice(&[0xde, 0xad]);
        let p = UdpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(p.payload(), &UDP_DNS_QUERY[28..]);
        assert!(p.verify_checksum(SRC, DST));
    }

    #[test]
    fn checksum_zero_means_none_and_zero_is_sent_as_ffff() {
        let mut buf = datagram();
        buf[6] = 0;
        buf[7] = 0;
        buf[20] ^= 0xff;
        let p = UdpPacket::new_checked(&buf[..]).unwrap();
        assert!(p.verify_checksum(SRC, DST));

        // Pick the payload's last (even-aligned) word so the sum is 0xffff.
        let mut buf = datagram();
        buf.extend_from_slice(&[0, 0, 0]);
        let mut p = UdpPacket::new_checked(&mut buf[..]).unwrap();
        p.set_len(40);
        p.fill_checksum(SRC, DST);
        let want_sum_zero = p.checksum();
        let n = p.payload_mut().len();
        p.payload_mut()[n - 2..].copy_from_slice(&want_sum_zero.to_be_bytes());
        p.fill_checksum(SRC, DST);
        assert_eq!(p.checksum(), 0xffff);
        assert!(p.verify_checksum(SRC, DST));
    }

    #[test]
    fn wrong_checksum_detected() {
        let mut buf = datagram();
        buf[30] ^= 0x04;
        let p = UdpPacket::new_checked(&buf[..]).unwrap();
        assert!(!p.verify_checksum(SRC, DST));
        assert_eq!(
            UdpRepr::parse(&p, SRC, DST, ChecksumMode::Software),
            Err(Error::Checksum)
        );
        assert!(UdpRepr::parse(&p, SRC, DST, ChecksumMode::Offload).is_ok());
    }

    #[test]
    fn swap_ports_keeps_checksum_valid() {
        let mut buf = datagram();
        let mut p = UdpPacket::new_checked(&mut buf[..]).unwrap();
        p.swap_ports();
        assert_eq!((p.src_port(), p.dst_port()), (53, 54321));
        assert!(p.verify_checksum(DST, SRC));
        p.set_checksum(0x1234);
        assert_eq!(p.into_inner()[6..8], [0x12, 0x34]);
    }
}
