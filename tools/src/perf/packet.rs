//! The UDP/IPv4 frame txonly sends (same addresses as testpmd's txonly:
//! 198.18.0.1:9 -> 198.18.0.2:9).

use crate::error::{Error, Result};
use stack::wire::checksum;

pub const ETH_HDR: usize = 14;
pub const IPV4_HDR: usize = 20;
pub const UDP_HDR: usize = 8;
pub const HEADERS: usize = ETH_HDR + IPV4_HDR + UDP_HDR;

pub const SRC_IP: [u8; 4] = [198, 18, 0, 1];
pub const DST_IP: [u8; 4] = [198, 18, 0, 2];
pub const UDP_PORT: u16 = 9;

/// A `len`-byte frame. The payload byte at offset i is `i as u8`, so a
/// receiver can check every byte.
pub fn udp_frame(src_mac: [u8; 6], dst_mac: [u8; 6], len: usize) -> Vec<u8> {
    assert!(len >= HEADERS, "frame shorter than its headers");
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());

    let ip_len = (len - ETH_HDR) as u16;
    let ip = &mut f[ETH_HDR..ETH_HDR + IPV4_HDR];
    ip[0] = 0x45; // version 4, 5 words
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64; // TTL
    ip[9] = 17; // UDP
    ip[12..16].copy_from_slice(&SRC_IP);
    ip[16..20].copy_from_slice(&DST_IP);
    let csum = checksum::finish(checksum::data(ip));
    ip[10..12].copy_from_slice(&csum.to_be_bytes());

    let udp_len = ip_len - IPV4_HDR as u16;
    let udp = &mut f[ETH_HDR + IPV4_HDR..HEADERS];
    udp[0..2].copy_from_slice(&UDP_PORT.to_be_bytes());
    udp[2..4].copy_from_slice(&UDP_PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    // UDP checksum 0: none, which IPv4 allows.
    for (i, b) in f[HEADERS..].iter_mut().enumerate() {
        *b = i as u8;
    }
    f
}

pub fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    let bad = || {
        Error::Usage(format!(
            "malformed MAC address '{s}': use six hex bytes such as 02:00:00:00:00:01"
        ))
    };
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (b, p) in mac.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    Ok(mac)
}

pub fn format_mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_has_valid_ip_checksum_and_lengths() {
        let f = udp_frame([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], 128);
        assert_eq!(f.len(), 128);
        assert_eq!(
            checksum::finish(checksum::data(&f[ETH_HDR..ETH_HDR + IPV4_HDR])),
            0
        );
        assert_eq!(u16::from_be_bytes([f[16], f[17]]), 114);
        assert_eq!(u16::from_be_bytes([f[38], f[39]]), 94);
        assert_eq!(f[HEADERS + 5], 5);
    }

    #[test]
    fn macs_parse_and_print() {
        let m = parse_mac("02:aB:00:00:00:ff").unwrap();
        assert_eq!(m, [2, 0xab, 0, 0, 0, 0xff]);
        assert_eq!(format_mac(m), "02:ab:00:00:00:ff");
        assert!(parse_mac("02:00:00:00:00").is_err());
        assert!(parse_mac("zz:00:00:00:00:00").is_err());
    }
}
