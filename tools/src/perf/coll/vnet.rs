//! The virtual network of `--local-ranks N --transport dpdk`: a Linux
//! bridge with one veth pair per rank and lane; each rank runs our stack
//! on net_af_xdp (or net_af_packet) over its ends, the other ends are
//! bridge ports. Lane k of every rank has its own subnet, 10.98.k.0/24.
//! Ranks stay in this network namespace (their rendezvous is TCP on
//! 127.0.0.1); their QUIC traffic goes DPDK -> veth -> bridge -> veth ->
//! DPDK. The bridge and its ports live in a network namespace of their
//! own, where bridged frames skip netfilter (`bridge-nf-call-*` = 0 there:
//! with `br_netfilter` loaded, as container hosts have it, every frame
//! would otherwise cross the host's iptables hooks; the host's own setting
//! is left alone). Removed on drop, also when a rank fails.

use std::net::Ipv4Addr;
use std::process::Command;

use crate::error::{Error, Result};

/// Rank `i` gets 10.98.k.(i+1)/24 on its lane-k port.
const NET: [u8; 2] = [10, 98];

/// Veths at most: their names (`ac<pid>r<j>p`) must fit Linux's 15
/// characters.
const MAX_LINKS: usize = 999;

/// The PMD each rank runs on its veth end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pmd {
    /// AF_XDP sockets: the fast one; receives into the PMD's own UMEM pool.
    AfXdp,
    /// AF_PACKET sockets: copies frames into any pool (an arena's too).
    AfPacket,
}

pub struct VirtualNet {
    /// The namespace holding the bridge and its ports.
    netns: String,
    bridge: String,
    /// Our veth ends: rank r's lane k is `links[r * lanes + k]`.
    links: Vec<String>,
    lanes: usize,
    pmd: Pmd,
    mtu: u16,
    /// The ranks get `--mtu` from us unless the user gave one (each rank
    /// sees the user's flags too, and a flag given twice is refused).
    add_mtu_flag: bool,
}

impl Pmd {
    /// The links' MTU unless `--mtu` names one: net_af_xdp takes the
    /// largest frame that fits its 4 KiB umem chunks (twice the payload of
    /// 1500 per packet, and per-packet work is what bounds these ranks);
    /// net_af_packet keeps Ethernet's 1500.
    pub fn default_mtu(self) -> u16 {
        match self {
            Pmd::AfXdp => stack::runtime::AF_XDP_MAX_MTU,
            Pmd::AfPacket => 1500,
        }
    }
}

impl VirtualNet {
    /// Creates the bridge and a veth pair for each of `lanes` lanes of `n`
    /// ranks, with the `--mtu` given, or the PMD's default (names carry our
    /// pid, so concurrent runs do not collide). Needs root.
    pub fn create(n: usize, lanes: usize, pmd: Pmd, mtu_flag: Option<u16>) -> Result<VirtualNet> {
        let mtu = mtu_flag.unwrap_or(pmd.default_mtu());
        if n > 253 {
            return Err(Error::Usage(format!(
                "--transport dpdk: at most 253 local ranks, not {n}"
            )));
        }
        if n * lanes > MAX_LINKS {
            return Err(Error::Usage(format!(
                "--transport dpdk: at most {MAX_LINKS} local ports (ranks x lanes), not {n} x {lanes}"
            )));
        }
        let pid = std::process::id();
        let mut net = VirtualNet {
            netns: format!("ac{pid}ns"),
            bridge: format!("ac{pid}br"),
            links: Vec::new(),
            lanes,
            pmd,
            mtu,
            add_mtu_flag: mtu_flag.is_none(),
        };
        ip(&["netns", "add", &net.netns])?;
        // Before anything is created there: the defaults apply to it.
        // Without them the run still works, only slower, or exposed to
        // the host's rules (a read-only /proc/sys, a kernel older than
        // 5.3 where these settings are not per namespace).
        if let Err(e) = ip(&["netns", "exec", &net.netns, "sh", "-c", NETNS_SETTINGS]) {
            crate::eline!(
                "ainftp-perf: warning: the ranks' bridge keeps the host's netfilter hooks: {e}"
            );
        }
        let ns = net.netns.clone();
        let in_ns = |args: &[&str]| ip(&[&["-n", ns.as_str()], args].concat());
        in_ns(&["link", "add", &net.bridge, "type", "bridge"])?;
        in_ns(&["link", "set", &net.bridge, "up"])?;
        let mtu_text = mtu.to_string();
        let mut base = first_index(pid);
        for j in 0..n * lanes {
            let dev = format!("ac{pid}r{j}");
            let port = format!("{dev}p");
            // net_af_packet names its fanout group by (pid ^ ifindex) &
            // 0xffff, and two ranks whose groups coincide on different
            // devices fail (PACKET_FANOUT: EINVAL). The ranks' ends get
            // indexes 4096 apart with the same low 12 bits, so two ranks
            // could share a group only if their pids did too, 4096 or more
            // apart: ranks started together never are. An index another
            // interface took moves the whole run's base on.
            let mut tries = 0;
            loop {
                let index = (base + (j as u32) * INDEX_STRIDE).to_string();
                let made = ip(&[
                    "link", "add", &dev, "index", &index, "type", "veth", "peer", "name", &port,
                ]);
                match made {
                    Ok(()) => break,
                    Err(_) if j == 0 && tries < 8 => {
                        tries += 1;
                        base += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
            net.links.push(dev.clone());
            ip(&["link", "set", &port, "netns", &ns])?;
            quiet_ipv6(&dev);
            ip(&["link", "set", &dev, "mtu", &mtu_text])?;
            in_ns(&["link", "set", &port, "mtu", &mtu_text])?;
            in_ns(&["link", "set", &port, "master", &net.bridge])?;
            in_ns(&["link", "set", &port, "up"])?;
            ip(&["link", "set", &dev, "up"])?;
        }
        Ok(net)
    }

    /// The per-rank flags: its ports and their addresses (one per lane),
    /// MTU and lcore.
    pub fn rank_args(&self, rank: usize, lcore: u32) -> Vec<String> {
        let driver = match self.pmd {
            Pmd::AfXdp => "net_af_xdp",
            Pmd::AfPacket => "net_af_packet",
        };
        let mut args = Vec::new();
        for lane in 0..self.lanes {
            let j = rank * self.lanes + lane;
            args.extend([
                "--vdev".into(),
                format!("{driver}{j},iface={}", self.links[j]),
                "--ip".into(),
                format!("{}/24", Self::address(rank, lane)),
            ]);
        }
        args.extend(["--lcores".into(), lcore.to_string()]);
        if self.add_mtu_flag {
            args.extend(["--mtu".into(), self.mtu.to_string()]);
        }
        args
    }

    pub fn address(rank: usize, lane: usize) -> Ipv4Addr {
        Ipv4Addr::new(NET[0], NET[1], lane as u8, rank as u8 + 1)
    }
}

impl Drop for VirtualNet {
    fn drop(&mut self) {
        // Deleting one end of a veth pair deletes both; the namespace
        // takes the bridge with it.
        for dev in &self.links {
            let _ = ip(&["link", "del", dev]);
        }
        let _ = ip(&["netns", "del", &self.netns]);
    }
}

/// Interface indexes of one run's rank ends are this far apart (see
/// `VirtualNet::create`).
const INDEX_STRIDE: u32 = 4096;

/// The first rank end's interface index: far above the indexes the
/// kernel hands out, and different for concurrent runs.
fn first_index(pid: u32) -> u32 {
    (1 << 20) + (pid & (INDEX_STRIDE - 1))
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| Error::Io("running ip(8) (is iproute2 installed?)".into(), e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "ip {}: {} (--transport dpdk with --local-ranks needs root)",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Run in the bridge's namespace as it is made: bridged frames skip
/// netfilter (where `br_netfilter` is loaded), and no IPv6 on anything
/// created there (as `quiet_ipv6`).
const NETNS_SETTINGS: &str = "\
    echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; \
    echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; \
    for f in /proc/sys/net/bridge/bridge-nf-call-iptables \
             /proc/sys/net/bridge/bridge-nf-call-ip6tables \
             /proc/sys/net/bridge/bridge-nf-call-arptables; do \
        if [ -e $f ]; then echo 0 > $f || exit 1; fi; \
    done";

/// No IPv6 on the virtual links: the kernel's router solicitations and
/// neighbour discovery would only be noise in the ranks' drop counters.
fn quiet_ipv6(dev: &str) {
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"), "1");
}
