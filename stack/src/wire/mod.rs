//! Zero-copy packet views and builders for the protocols the stack speaks.
//!
//! Every protocol comes in two layers, in the smoltcp tradition:
//!
//! * `XxxPacket<T>` wraps a byte buffer (an mbuf slice, a `Vec`, a `&[u8]`)
//!   without copying. `new_checked` validates the lengths once, so that the
//!   getters of a checked packet never panic whatever the bytes are: the
//!   fast path pays for bounds checks in one place only.
//! * `XxxRepr` is a plain value with the fields the stack acts on. `parse`
//!   turns a checked packet into one, rejecting what the stack cannot handle;
//!   `emit` writes one into a buffer and reports a short buffer as an error
//!   instead of panicking, since buffer sizes come from the caller at run time.
//!
//! Multi-byte fields are big-endian on the wire and read byte by byte, so the
//! views need no alignment and no `unsafe`.

pub mod arp;
pub mod checksum;
pub mod ethernet;
pub mod icmpv4;
pub mod ipv4;
pub mod udp;

use core::fmt;

pub use arp::{ArpOperation, ArpPacket, ArpRepr, BUFFER_LEN as ARP_BUFFER_LEN};
pub use ethernet::{
    ether_type, EthernetAddress, EthernetFrame, EthernetRepr, HEADER_LEN as ETHERNET_HEADER_LEN,
    VLAN_HEADER_LEN as ETHERNET_VLAN_HEADER_LEN,
};
pub use icmpv4::{
    echo_request_to_reply_in_place, icmpv4_type, Icmpv4Packet, Icmpv4Repr,
    HEADER_LEN as ICMPV4_HEADER_LEN,
};
pub use ipv4::{ip_protocol, Ipv4Packet, Ipv4Repr, HEADER_LEN as IPV4_HEADER_LEN};
pub use udp::{pseudo_header_checksum, UdpPacket, UdpRepr, HEADER_LEN as UDP_HEADER_LEN};

/// Why a buffer could not be viewed, parsed or emitted.
///
/// Kept to three cases because the receive path only needs to know whether to
/// drop silently (all of them) and what to count; the details belong in logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer is shorter than the header or a length field claims.
    Truncated,
    /// A field holds a value that is invalid or that this stack does not handle.
    Malformed,
    /// The checksum does not match the contents.
    Checksum,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Truncated => "truncated packet",
            Error::Malformed => "malformed packet",
            Error::Checksum => "checksum mismatch",
        })
    }
}

impl std::error::Error for Error {}

/// Result of wire-level operations.
pub type Result<T> = core::result::Result<T, Error>;

/// Who computes (on transmit) or has verified (on receive) a checksum.
///
/// DPDK NICs can do both; the stack decides per port at start-up and passes
/// the choice down, so the same emit/parse code serves both kinds of port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChecksumMode {
    /// Compute on transmit, verify on receive, in software.
    #[default]
    Software,
    /// Transmit: leave the field for the NIC (see each `emit` for what it
    /// needs there). Receive: skip verification, the caller has checked the
    /// NIC's "checksum good" flag.
    Offload,
}

/// Reads a big-endian u16 at `at`; callers have checked the bounds.
pub(crate) fn read_u16(buf: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([buf[at], buf[at + 1]])
}

/// Writes a big-endian u16 at `at`; callers have checked the bounds.
pub(crate) fn write_u16(buf: &mut [u8], at: usize, value: u16) {
    buf[at..at + 2].copy_from_slice(&value.to_be_bytes());
}

/// Reads an IPv4 address at `at`; callers have checked the bounds.
pub(crate) fn read_ipv4(buf: &[u8], at: usize) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(buf[at], buf[at + 1], buf[at + 2], buf[at + 3])
}

/// Writes an IPv4 address at `at`; callers have checked the bounds.
pub(crate) fn write_ipv4(buf: &mut [u8], at: usize, addr: std::net::Ipv4Addr) {
    buf[at..at + 4].copy_from_slice(&addr.octets());
}

/// Packets shared by the unit tests, generated once with Python's `struct`
/// and checked by hand; the checksums in them are the ones Linux would send.
#[cfg(test)]
pub(crate) mod fixtures {
    /// `ping -c1 192.0.2.1` from 192.0.2.10: IPv4 + ICMP echo request,
    /// ident 0x0b6c, seq 1, 56 data bytes (a timeval, then 0x10..=0x37).
    #[rustfmt::skip]
    pub const PING_REQUEST: [u8; 84] = [
        0x45, 0x00, 0x00, 0x54, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x01, 0x9a, 0x57,
        0xc0, 0x00, 0x02, 0x0a, 0xc0, 0x00, 0x02, 0x01, 0x08, 0x00, 0x97, 0x87,
        0x0b, 0x6c, 0x00, 0x01, 0x00, 0xf1, 0x53, 0x65, 0x00, 0x00, 0x00, 0x00,
        0x40, 0xe2, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x11, 0x12, 0x13,
        0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
        0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x2b,
        0x2c, 0x2d, 0x2e, 0x2f, 0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37,
    ];

    /// A DNS query for example.com/A from 192.0.2.10:54321 to 192.0.2.53:53,
    /// IPv4 + UDP with checksum 0xc55b.
    #[rustfmt::skip]
    pub const UDP_DNS_QUERY: [u8; 57] = [
        0x45, 0x00, 0x00, 0x39, 0xbe, 0xef, 0x40, 0x00, 0x40, 0x11, 0xf7, 0x84,
        0xc0, 0x00, 0x02, 0x0a, 0xc0, 0x00, 0x02, 0x35, 0xd4, 0x31, 0x00, 0x35,
        0x00, 0x25, 0xc5, 0x5b, 0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x07, 0x65, 0x78, 0x61, 0x6d, 0x70, 0x6c, 0x65,
        0x03, 0x63, 0x6f, 0x6d, 0x00, 0x00, 0x01, 0x00, 0x01,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_displays_and_is_std_error() {
        let e: Box<dyn std::error::Error> = Box::new(Error::Checksum);
        assert_eq!(e.to_string(), "checksum mismatch");
        assert_eq!(Error::Truncated.to_string(), "truncated packet");
        assert_eq!(Error::Malformed.to_string(), "malformed packet");
    }
}
