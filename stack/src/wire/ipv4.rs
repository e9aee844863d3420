//! IPv4 headers (RFC 791).
//!
//! Options are tolerated and skipped: the stack originates none and acts on
//! none, but peers may send them. Fragments can be viewed but not parsed into
//! an `Ipv4Repr`, because the stack does no reassembly and a fragment's
//! payload is not a whole upper-layer message.

use std::net::Ipv4Addr;

use super::{checksum, read_ipv4, read_u16, write_ipv4, write_u16, ChecksumMode, Error, Result};

/// Length of a header without options, the only kind the stack emits.
pub const HEADER_LEN: usize = 20;

/// IP protocol numbers the stack dispatches on; plain `u8`s so unknown
/// values pass through unchanged.
pub mod ip_protocol {
    /// Internet Control Message Protocol.
    pub const ICMP: u8 = 1;
    /// User Datagram Protocol.
    pub const UDP: u8 = 17;
}

const VER_IHL: usize = 0;
const DSCP_ECN: usize = 1;
const TOTAL_LEN: usize = 2;
const IDENT: usize = 4;
const FLAGS_FRAG: usize = 6;
const TTL: usize = 8;
const PROTOCOL: usize = 9;
const CHECKSUM: usize = 10;
const SRC: usize = 12;
const DST: usize = 16;

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const FRAG_MASK: u16 = 0x1fff;

/// A view of an IPv4 packet in a byte buffer.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps a buffer without checks; getters may then panic on short buffers.
    pub fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    /// Wraps a buffer after checking version 4, IHL >= 5 and
    /// `header_len <= total_len <= buffer length`. A longer buffer is fine:
    /// Ethernet pads short frames, and `payload` stops at `total_len`.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let packet = Self::new_unchecked(buffer);
        let len = packet.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if packet.version() != 4 || packet.header_len() < HEADER_LEN {
            return Err(Error::Malformed);
        }
        let total = usize::from(packet.total_len());
        if packet.header_len() > len {
            return Err(Error::Truncated);
        }
        if total < packet.header_len() {
            return Err(Error::Malformed);
        }
        if total > len {
            return Err(Error::Truncated);
        }
        Ok(packet)
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// IP version (4 for a checked packet).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[VER_IHL] >> 4
    }

    /// Header length in bytes, options included.
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[VER_IHL] & 0x0f) * 4
    }

    /// The DSCP and ECN bits as one byte.
    pub fn dscp_ecn(&self) -> u8 {
        self.buffer.as_ref()[DSCP_ECN]
    }

    /// Total length of header and payload.
    pub fn total_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), TOTAL_LEN)
    }

    /// Identification, used only to reassemble fragments.
    pub fn ident(&self) -> u16 {
        read_u16(self.buffer.as_ref(), IDENT)
    }

    /// Don't Fragment flag.
    pub fn dont_frag(&self) -> bool {
        read_u16(self.buffer.as_ref(), FLAGS_FRAG) & FLAG_DF != 0
    }

    /// More Fragments flag.
    pub fn more_frags(&self) -> bool {
        read_u16(self.buffer.as_ref(), FLAGS_FRAG) & FLAG_MF != 0
    }

    /// Fragment offset in bytes (the field counts 8-byte units).
    pub fn frag_offset(&self) -> u16 {
        (read_u16(self.buffer.as_ref(), FLAGS_FRAG) & FRAG_MASK) * 8
    }

    /// Whether this is any fragment but an unfragmented datagram.
    pub fn is_fragment(&self) -> bool {
        self.more_frags() || self.frag_offset() != 0
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[TTL]
    }

    /// Same as `ttl`, under the IPv6 name generic code uses.
    pub fn hop_limit(&self) -> u8 {
        self.ttl()
    }

    /// Upper-layer protocol number (see `ip_protocol`).
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[PROTOCOL]
    }

    /// Same as `protocol`, under the IPv6 name generic code uses.
    pub fn next_header(&self) -> u8 {
        self.protocol()
    }

    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), CHECKSUM)
    }

    /// Source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        read_ipv4(self.buffer.as_ref(), SRC)
    }

    /// Destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        read_ipv4(self.buffer.as_ref(), DST)
    }

    /// Whether the header checksum (options included) is correct.
    pub fn verify_checksum(&self) -> bool {
        checksum::data(&self.buffer.as_ref()[..self.header_len()]) == 0xffff
    }

    /// Bytes between the header and `total_len`, excluding link padding.
    /// Clamped to the buffer, so it cannot panic even if a setter broke the
    /// length invariant.
    pub fn payload(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        let end = usize::from(self.total_len()).min(buf.len());
        let start = self.header_len().min(end);
        &buf[start..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Sets version 4 and the header length in bytes (a multiple of 4,
    /// 20..=60; other values are the caller's bug and are truncated).
    pub fn set_version_and_header_len(&mut self, header_len: usize) {
        self.buffer.as_mut()[VER_IHL] = 0x40 | ((header_len / 4) as u8 & 0x0f);
    }

    /// Sets the DSCP and ECN byte.
    pub fn set_dscp_ecn(&mut self, value: u8) {
        self.buffer.as_mut()[DSCP_ECN] = value;
    }

    /// Sets the total length; keep it within the buffer.
    pub fn set_total_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), TOTAL_LEN, value);
    }

    /// Sets the identification.
    pub fn set_ident(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), IDENT, value);
    }

    /// Sets the flags and fragment offset (offset in bytes, a multiple of 8).
    pub fn set_flags_and_frag_offset(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let mut v = (offset / 8) & FRAG_MASK;
        if dont_frag {
            v |= FLAG_DF;
        }
        if more_frags {
            v |= FLAG_MF;
        }
        write_u16(self.buffer.as_mut(), FLAGS_FRAG, v);
    }

    /// Sets the time to live; the checksum must be refreshed after.
    pub fn set_ttl(&mut self, value: u8) {
        self.buffer.as_mut()[TTL] = value;
    }

    /// Sets the protocol number.
    pub fn set_protocol(&mut self, value: u8) {
        self.buffer.as_mut()[PROTOCOL] = value;
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), CHECKSUM, value);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, addr: Ipv4Addr) {
        write_ipv4(self.buffer.as_mut(), SRC, addr);
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, addr: Ipv4Addr) {
        write_ipv4(self.buffer.as_mut(), DST, addr);
    }

    /// Computes the header checksum in software and stores it.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let sum = checksum::data(&self.buffer.as_ref()[..self.header_len()]);
        self.set_checksum(checksum::finish(sum));
    }

    /// Exchanges source and destination, to answer a packet in place.
    ///
    /// The checksum stays valid without recomputation: the one's complement
    /// sum does not depend on the order of the words. The same holds for the
    /// UDP and TCP pseudo-header sums.
    pub fn swap_addrs(&mut self) {
        let buf = self.buffer.as_mut();
        let (src, dst) = buf[SRC..DST + 4].split_at_mut(4);
        src.swap_with_slice(dst);
    }

    /// Mutable bytes between the header and `total_len`, clamped like `payload`.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.total_len()).min(self.buffer.as_ref().len());
        let start = self.header_len().min(end);
        &mut self.buffer.as_mut()[start..end]
    }
}

/// The fields of an unfragmented IPv4 packet that the stack acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    pub src_addr: Ipv4Addr,
    pub dst_addr: Ipv4Addr,
    pub protocol: u8,
    pub payload_len: usize,
    pub ttl: u8,
    pub ident: u16,
    pub dont_frag: bool,
}

impl Ipv4Repr {
    /// Reads a packet, skipping options and ignoring DSCP/ECN.
    ///
    /// With `ChecksumMode::Software` a bad header checksum is `Checksum`;
    /// `Offload` trusts the caller to have checked the NIC's verdict.
    /// Fragments are `Malformed` (see the module notes).
    pub fn parse<T: AsRef<[u8]>>(packet: &Ipv4Packet<T>, mode: ChecksumMode) -> Result<Self> {
        let payload_len = usize::from(packet.total_len())
            .checked_sub(packet.header_len())
            .ok_or(Error::Malformed)?;
        if packet.version() != 4 || packet.header_len() < HEADER_LEN || packet.is_fragment() {
            return Err(Error::Malformed);
        }
        if mode == ChecksumMode::Software && !packet.verify_checksum() {
            return Err(Error::Checksum);
        }
        Ok(Ipv4Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            payload_len,
            ttl: packet.ttl(),
            ident: packet.ident(),
            dont_frag: packet.dont_frag(),
        })
    }

    /// Always `HEADER_LEN`: the stack emits no options.
    pub fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Header plus payload.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN.saturating_add(self.payload_len)
    }

    /// Writes the header into `buf`, which must hold the whole packet
    /// (`buffer_len()` bytes) so that the length field is never a lie; the
    /// payload may be written before or after.
    ///
    /// `Offload` leaves 0 in the checksum field for the NIC to fill (DPDK's
    /// IPv4 checksum offload expects that). Errors: `Malformed` if the total
    /// length exceeds 65535, `Truncated` if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8], mode: ChecksumMode) -> Result<()> {
        let total = u16::try_from(self.buffer_len()).map_err(|_| Error::Malformed)?;
        if buf.len() < usize::from(total) {
            return Err(Error::Truncated);
        }
        let mut p = Ipv4Packet::new_unchecked(buf);
        p.set_version_and_header_len(HEADER_LEN);
        p.set_dscp_ecn(0);
        p.set_total_len(total);
        p.set_ident(self.ident);
        p.set_flags_and_frag_offset(self.dont_frag, false, 0);
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        let value = match mode {
            // Summed from the field values, not read back from `buf`: loads
            // of bytes just stored stall on store forwarding.
            ChecksumMode::Software => checksum::finish(self.header_sum(total)),
            ChecksumMode::Offload => 0,
        };
        p.set_checksum(value);
        Ok(())
    }

    /// Folded sum of the header `emit` writes (checksum field 0).
    fn header_sum(&self, total: u16) -> u16 {
        let (src, dst) = (u32::from(self.src_addr), u32::from(self.dst_addr));
        let flags: u32 = if self.dont_frag { 0x4000 } else { 0 };
        let acc = 0x4500u32
            + u32::from(total)
            + u32::from(self.ident)
            + flags
            + (u32::from(self.ttl) << 8 | u32::from(self.protocol))
            + (src >> 16)
            + (src & 0xffff)
            + (dst >> 16)
            + (dst & 0xffff);
        checksum::fold(u64::from(acc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::{PING_REQUEST, UDP_DNS_QUERY};

    fn ping_repr() -> Ipv4Repr {
        Ipv4Repr {
            src_addr: Ipv4Addr::new(192, 0, 2, 10),
            dst_addr: Ipv4Addr::new(192, 0, 2, 1),
            protocol: ip_protocol::ICMP,
            payload_len: 64,
            ttl: 64,
            ident: 0x1c46,
            dont_frag: true,
        }
    }

    #[test]
    fn parse_real_ping() {
        let p = Ipv4Packet::new_checked(&PING_REQUEST[..]).unwrap();
        assert_eq!(p.version(), 4);
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.total_len(), 84);
        assert_eq!(p.hop_limit(), 64);
        assert_eq!(p.next_header(), ip_protocol::ICMP);
        assert_eq!(p.checksum(), 0x9a57);
        assert!(p.verify_checksum());
        assert!(!p.is_fragment() && !p.more_frags() && p.dont_frag());
        assert_eq!(p.payload(), &PING_REQUEST[20..]);
        assert_eq!(
            Ipv4Repr::parse(&p, ChecksumMode::Software).unwrap(),
            ping_repr()
        );
    }

    #[test]
    fn emit_matches_capture() {
        let mut buf = PING_REQUEST;
        buf[..20].fill(0xaa);
        ping_repr().emit(&mut buf, ChecksumMode::Software).unwrap();
        assert_eq!(buf, PING_REQUEST);
        ping_repr().emit(&mut buf, ChecksumMode::Offload).unwrap();
        assert_eq!(&buf[10..12], &[0, 0]);
        assert_eq!(
            ping_repr().emit(&mut buf[..83], ChecksumMode::Software),
            Err(Error::Truncated)
        );
    }

    #[test]
    fn emit_rejects_oversized() {
        let repr = Ipv4Repr {
            payload_len: 65_516,
            ..ping_repr()
        };
        let mut buf = vec![0u8; 70_000];
        assert_eq!(
            repr.emit(&mut buf, ChecksumMode::Software),
            Err(Error::Malformed)
        );
        let repr = Ipv4Repr {
            payload_len: 65_515,
            ..ping_repr()
        };
        assert_eq!(repr.emit(&mut buf, ChecksumMode::Software), Ok(()));
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p, ChecksumMode::Software), Ok(repr));
    }

    #[test]
    fn truncated_at_every_length() {
        for n in 0..PING_REQUEST.len() {
            assert_eq!(
                Ipv4Packet::new_checked(&PING_REQUEST[..n]).err(),
                Some(Error::Truncated),
                "length {n}"
            );
        }
    }

    #[test]
    fn padding_is_not_payload() {
        let mut padded = UDP_DNS_QUERY.to_vec();
        padded.extend_from_slice(&[0; 7]);
        let p = Ipv4Packet::new_checked(&padded[..]).unwrap();
        assert_eq!(p.payload(), &UDP_DNS_QUERY[20..]);
    }

    #[test]
    fn bad_version_ihl_and_length_are_malformed() {
        for (first, total) in [(0x65, 84), (0x44, 84), (0x40, 84), (0x45, 19), (0x46, 20)] {
            let mut buf = PING_REQUEST;
            buf[0] = first;
            buf[2..4].copy_from_slice(&u16::to_be_bytes(total));
            assert_eq!(
                Ipv4Packet::new_checked(&buf[..]).err(),
                Some(Error::Malformed),
                "{first:#x} {total}"
            );
        }
        // IHL 15 on a 40-byte buffer: the header runs past the end.
        let mut buf = PING_REQUEST;
        buf[0] = 0x4f;
        assert_eq!(
            Ipv4Packet::new_checked(&buf[..40]).err(),
            Some(Error::Truncated)
        );
    }

    #[test]
    fn options_are_skipped() {
        // Insert a 4-byte option (NOP NOP NOP EOL) and fix up the header.
        let mut buf = PING_REQUEST[..20].to_vec();
        buf.extend_from_slice(&[1, 1, 1, 0]);
        buf.extend_from_slice(&PING_REQUEST[20..]);
        let mut p = Ipv4Packet::new_unchecked(&mut buf[..]);
        p.set_version_and_header_len(24);
        p.set_total_len(88);
        p.fill_checksum();
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.header_len(), 24);
        assert!(p.verify_checksum());
        assert_eq!(p.payload(), &PING_REQUEST[20..]);
        assert_eq!(
            Ipv4Repr::parse(&p, ChecksumMode::Software).unwrap(),
            ping_repr()
        );
    }

    #[test]
    fn wrong_checksum_detected() {
        let mut buf = PING_REQUEST;
        buf[11] ^= 0x01;
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert!(!p.verify_checksum());
        assert_eq!(
            Ipv4Repr::parse(&p, ChecksumMode::Software),
            Err(Error::Checksum)
        );
        assert!(Ipv4Repr::parse(&p, ChecksumMode::Offload).is_ok());
    }

    #[test]
    fn fragments_detected() {
        for (mf, offset) in [(true, 0), (true, 1480), (false, 1480), (false, 65528)] {
            let mut buf = PING_REQUEST;
            let mut p = Ipv4Packet::new_unchecked(&mut buf[..]);
            p.set_flags_and_frag_offset(false, mf, offset);
            p.fill_checksum();
            let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
            assert!(p.is_fragment());
            assert_eq!((p.more_frags(), p.frag_offset()), (mf, offset));
            assert_eq!(
                Ipv4Repr::parse(&p, ChecksumMode::Software),
                Err(Error::Malformed)
            );
        }
    }

    #[test]
    fn setters_keep_checksum_valid_when_refilled() {
        let mut buf = PING_REQUEST;
        let mut p = Ipv4Packet::new_checked(&mut buf[..]).unwrap();
        p.swap_addrs();
        assert!(p.verify_checksum(), "swapping must not need a refill");
        assert_eq!(p.src_addr(), Ipv4Addr::new(192, 0, 2, 1));
        assert_eq!(p.dst_addr(), Ipv4Addr::new(192, 0, 2, 10));
        p.set_ttl(63);
        p.set_ident(7);
        p.set_src_addr(Ipv4Addr::new(198, 51, 100, 1));
        p.set_dst_addr(Ipv4Addr::new(198, 51, 100, 2));
        assert!(!p.verify_checksum());
        p.fill_checksum();
        assert!(p.verify_checksum());
        p.payload_mut()[0] = 0;
        p.set_checksum(0x1234);
        assert_eq!(p.checksum(), 0x1234);
        assert_eq!(p.into_inner()[20], 0);
    }
}
