//! Who the host is on the wire: addresses, subnet, gateway, VLAN, statics.

use std::net::Ipv4Addr;

use crate::host::neighbour::NeighbourConfig;
use crate::wire::EthernetAddress;

#[derive(Debug, Clone)]
pub struct HostConfig {
    pub mac: EthernetAddress,
    pub ip: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Option<Ipv4Addr>,
    /// 802.1Q VLAN to tag with and accept; None: untagged only.
    pub vlan: Option<u16>,
    pub static_neighbours: Vec<(Ipv4Addr, EthernetAddress)>,
    pub neighbour: NeighbourConfig,
    pub ttl: u8,
}

impl HostConfig {
    pub fn new(mac: EthernetAddress, ip: Ipv4Addr, prefix_len: u8) -> HostConfig {
        HostConfig {
            mac,
            ip,
            prefix_len,
            gateway: None,
            vlan: None,
            static_neighbours: Vec::new(),
            neighbour: NeighbourConfig::default(),
            ttl: 64,
        }
    }

    fn mask(&self) -> u32 {
        match self.prefix_len {
            0 => 0,
            p => u32::MAX << (32 - p.min(32)),
        }
    }

    pub fn in_subnet(&self, ip: Ipv4Addr) -> bool {
        (u32::from(ip) ^ u32::from(self.ip)) & self.mask() == 0
    }

    /// Whether a packet for `ip` goes to every host on the link: the
    /// limited broadcast address, or the subnet's directed broadcast
    /// address. /31 and /32 subnets have none (RFC 3021): on a /31 the
    /// all-ones host is the peer, sent to by its MAC.
    pub fn is_broadcast(&self, ip: Ipv4Addr) -> bool {
        ip.is_broadcast() || self.reserved_in_subnet(ip) == Some("broadcast")
    }

    /// Whom to send a packet for `dst` to on the link: `dst` itself inside
    /// the subnet, else the gateway; None when there is no route.
    pub fn next_hop(&self, dst: Ipv4Addr) -> Option<Ipv4Addr> {
        if self.in_subnet(dst) {
            Some(dst)
        } else {
            self.gateway
        }
    }

    /// "network" or "broadcast" when `ip` is that address of our subnet;
    /// /31 and /32 subnets have neither (RFC 3021).
    pub fn reserved_in_subnet(&self, ip: Ipv4Addr) -> Option<&'static str> {
        if self.prefix_len >= 31 || !self.in_subnet(ip) {
            return None;
        }
        let host_bits = u32::from(ip) & !self.mask();
        if host_bits == 0 {
            Some("network")
        } else if host_bits == !self.mask() {
            Some("broadcast")
        } else {
            None
        }
    }

    /// Checks a user would want told before the port comes up.
    pub fn validate(&self) -> Result<(), String> {
        if self.prefix_len > 32 {
            return Err(format!("prefix length /{} is over 32", self.prefix_len));
        }
        if self.ip.is_unspecified()
            || self.ip.is_multicast()
            || self.ip.is_broadcast()
            || self.ip.is_loopback()
        {
            return Err(format!("{} cannot be a host address", self.ip));
        }
        if let Some(which) = self.reserved_in_subnet(self.ip) {
            return Err(format!(
                "{} is the {which} address of {}/{}, not a host's",
                self.ip, self.ip, self.prefix_len
            ));
        }
        if !self.mac.is_unicast() {
            return Err(format!("{} is not a unicast MAC address", self.mac));
        }

        if let Some(gw) = self.gateway {
            if !self.in_subnet(gw) {
                return Err(format!(
                    "gateway {gw} is outside {}/{}",
                    self.ip, self.prefix_len
                ));
            }
            if gw == self.ip {
                return Err(format!("gateway {gw} is our own address"));
            }
            if let Some(which) = self.reserved_in_subnet(gw) {
                return Err(format!("gateway {gw} is the subnet's {which} address"));
            }
        }
        if let Some(v) = self.vlan {
            if v == 0 || v >= 4095 {
                return Err(format!("VLAN id {v} is outside 1..4094"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_inside_the_subnet_directly_and_outside_via_the_gateway() {
        let mut c = HostConfig::new(
            EthernetAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Addr::new(10, 0, 0, 2),
            24,
        );
        let inside = Ipv4Addr::new(10, 0, 0, 77);
        let outside = Ipv4Addr::new(192, 168, 1, 1);
        assert_eq!(c.next_hop(inside), Some(inside));
        assert_eq!(c.next_hop(outside), None);
        c.gateway = Some(Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(c.next_hop(outside), c.gateway);
        assert!(c.is_broadcast(Ipv4Addr::new(10, 0, 0, 255)));
        assert!(c.is_broadcast(Ipv4Addr::BROADCAST));
        assert!(!c.is_broadcast(inside));
        assert!(c.validate().is_ok());
        c.gateway = Some(outside);
        assert!(c.validate().unwrap_err().contains("outside"));
        c.gateway = None;
        c.prefix_len = 0;
        assert!(c.in_subnet(outside));
    }

    #[test]
    fn a_31_has_no_broadcast_address_its_peer_is_a_host() {
        let ours = Ipv4Addr::new(10, 0, 0, 0);
        let peer = Ipv4Addr::new(10, 0, 0, 1);
        let c = HostConfig::new(EthernetAddress([2, 0, 0, 0, 0, 1]), ours, 31);
        assert!(c.validate().is_ok());
        assert_eq!(c.next_hop(peer), Some(peer));
        assert!(!c.is_broadcast(peer), "the peer is sent to by its MAC");
        assert!(c.is_broadcast(Ipv4Addr::BROADCAST));
    }

    #[test]
    fn the_subnet_s_network_and_broadcast_addresses_are_not_hosts() {
        let mac = EthernetAddress([2, 0, 0, 0, 0, 1]);
        let cfg = |ip: [u8; 4], prefix| HostConfig::new(mac, Ipv4Addr::from(ip), prefix);
        let e = cfg([10, 0, 0, 0], 24).validate().unwrap_err();
        assert!(e.contains("network address"), "{e}");
        let e = cfg([10, 0, 0, 255], 24).validate().unwrap_err();
        assert!(e.contains("broadcast address"), "{e}");
        let e = cfg([127, 0, 0, 2], 8).validate().unwrap_err();
        assert!(e.contains("cannot be a host"), "{e}");
        // Point-to-point links use both addresses of a /31 (RFC 3021).
        assert!(cfg([10, 0, 0, 0], 31).validate().is_ok());
        assert!(cfg([10, 0, 0, 1], 31).validate().is_ok());
        assert!(cfg([10, 0, 0, 7], 32).validate().is_ok());

        let mut c = cfg([10, 0, 0, 2], 24);
        c.gateway = Some(Ipv4Addr::new(10, 0, 0, 2));
        assert!(c.validate().unwrap_err().contains("our own address"));
        c.gateway = Some(Ipv4Addr::new(10, 0, 0, 255));
        let e = c.validate().unwrap_err();
        assert!(e.contains("broadcast address"), "{e}");
        c.gateway = Some(Ipv4Addr::new(10, 0, 0, 1));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn only_a_unicast_address_is_a_valid_mac() {
        let ip = Ipv4Addr::new(10, 0, 0, 2);
        assert!(HostConfig::new(EthernetAddress([2, 0, 0, 0, 0, 1]), ip, 24)
            .validate()
            .is_ok());
        for mac in [[0xff; 6], [1, 0, 0x5e, 0, 0, 1]] {
            let e = HostConfig::new(EthernetAddress(mac), ip, 24)
                .validate()
                .unwrap_err();
            assert!(e.contains("MAC address"), "{e}");
        }
    }
}
