//! The stack on net_af_xdp over a veth pair whose other end lives in a
//! network namespace with an ordinary kernel IP stack: kernel UDP sockets
//! in the namespace exchange datagrams with our echo, byte-exact, every
//! size up to the MTU, many flows at once; and the kernel pings us.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};

use common::*;
use stack::counters::DropReason;
use stack::io::dpdk::UdpMbuf;
use stack::io::Datagram;
use stack::runtime::{Echo, RuntimeConfig, Services, UdpHandler};

/// veth `ours` stays here for af_xdp; `theirs` goes into namespace `ns`
/// with `kernel_ip`. Removed on drop. The kernel's veth leaves UDP
/// checksums to "hardware" that does not exist on an XDP path (the frame
/// carries only the pseudo-header sum), so tx checksum offload is turned
/// off on its side, as on any link where a kernel sends to af_xdp.
struct VethNs {
    ns: String,
    ours: String,
}

impl VethNs {
    fn new(tag: u8, kernel_ip: Ipv4Addr) -> VethNs {
        let (ns, ours, theirs) = (
            format!("ainfns{tag}"),
            format!("ainfx{tag}a"),
            format!("ainfx{tag}b"),
        );
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &ns])
            .status();
        sh(&format!(
            "ip netns add {ns} && ip link add {ours} type veth peer name {theirs} && \
             ip link set {theirs} netns {ns} && ip link set {ours} up && \
             ip -n {ns} addr add {kernel_ip}/24 dev {theirs} && ip -n {ns} link set {theirs} up && \
             ip -n {ns} link set lo up && \
             ip netns exec {ns} ethtool -K {theirs} tx off >/dev/null"
        ));
        VethNs { ns, ours }
    }

    /// A UDP socket created inside the namespace (it stays there).
    fn socket(&self, bind: Ipv4Addr) -> UdpSocket {
        in_netns(&self.ns, || udp_socket(bind))
    }
}

impl Drop for VethNs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.ours])
            .status();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.ns])
            .status();
    }
}

#[test]
fn kernel_in_a_namespace_talks_udp_and_icmp_with_us_over_af_xdp() {
    let eal = eal("0");
    let (us, kernel) = (Ipv4Addr::new(10, 87, 0, 2), Ipv4Addr::new(10, 87, 0, 1));
    let veth = VethNs::new(87, kernel);
    let cfg = RuntimeConfig::new(&format!("net_af_xdp0,iface={}", veth.ours), us, 24);
    let run = Running::start(&eal, &cfg, |_| {
        let mut s = Services::new();
        s.listen(7, Box::new(Echo));
        s
    });
    let ping = sh_out(&format!(
        "ip netns exec {} ping -c 3 -i 0.2 -W 2 {us}",
        veth.ns
    ));
    assert!(ping.contains("3 received"), "ping over af_xdp:\n{ping}");

    let to = SocketAddrV4::new(us, 7);
    let sock = veth.socket(kernel);
    for n in 1..=1472 {
        echo_once(&sock, to, &pattern(n, n as u8));
    }
    let socks: Vec<_> = (0..16).map(|_| veth.socket(kernel)).collect();
    for round in 0..10u8 {
        for (i, s) in socks.iter().enumerate() {
            s.send_to(&pattern(200 + 70 * i, round), to).unwrap();
        }
        let mut buf = [0u8; 2048];
        for (i, s) in socks.iter().enumerate() {
            let (n, _) = recv(s, &mut buf).expect("echo of a flow");
            assert_eq!(&buf[..n], &pattern(200 + 70 * i, round)[..]);
        }
    }
    let report = run.finish();
    assert!(report.total.icmp_echo_replies >= 3);
    assert_eq!(report.total.dropped(DropReason::BadChecksum), 0);
    // net_af_xdp (DPDK 22.11) keeps mbufs after close: its fill ring
    // (2048, stocked when the loops start) and the frames of its last send,
    // which it reaps from the completion ring only at its next send: at
    // most the last round's 16 echoes (8 flows leave 8). A path that
    // leaked would leave up to ~1600 more.
    let (start, end) = (
        report.mbufs_in_use_at_start,
        report.mbufs_in_use_after_close,
    );
    assert!(start >= 2048, "fill ring not stocked: {report:?}");
    assert!(
        (start..=start + 16).contains(&end),
        "{start} mbufs out at start, {end} after close"
    );
}

/// The announcement at port up is seen by the kernel on the other end of
/// the link: with `arp_accept` on, Linux creates a neighbour entry from a
/// gratuitous ARP alone, so our MAC appears in its table before anything
/// has been sent to us or asked of us.
#[test]
fn the_kernel_learns_our_mac_from_the_gratuitous_arp_at_port_up() {
    let eal = eal("0");
    let (us, kernel) = (Ipv4Addr::new(10, 88, 0, 2), Ipv4Addr::new(10, 88, 0, 1));
    let veth = VethNs::new(88, kernel);
    let theirs = "ainfx88b";
    sh(&format!(
        "ip netns exec {} sysctl -qw net.ipv4.conf.{theirs}.arp_accept=1",
        veth.ns
    ));
    let neigh = || sh_out(&format!("ip -n {} neigh show {us} dev {theirs}", veth.ns));
    assert_eq!(neigh().trim(), "", "no entry for us before the port is up");

    let cfg = RuntimeConfig::new(&format!("net_af_xdp0,iface={}", veth.ours), us, 24);
    let run = Running::start(&eal, &cfg, |_| Services::new());
    let mac = run
        .mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut seen = neigh();
    while !seen.contains(&mac) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        seen = neigh();
    }
    let report = run.finish();
    assert!(
        seen.contains(&format!("lladdr {mac}")),
        "the kernel did not learn {us} at {mac} from our announcement; its entry: {seen:?}"
    );
    assert!(report.total.arp_requests_out >= 1);
    assert_eq!(report.total.arp_replies_out, 0, "nobody asked us anything");
}

/// Writes the payload's capacity into a reply as large as that capacity.
struct GrowToCapacity;

impl UdpHandler<UdpMbuf> for GrowToCapacity {
    fn on_datagram(&mut self, mut d: UdpMbuf, out: &mut Vec<UdpMbuf>) {
        let capacity = d.capacity();
        d.set_len(capacity);
        d.payload_mut()[..4].copy_from_slice(&(capacity as u32).to_be_bytes());
        out.push(d);
    }
}

/// A received datagram grows as far as its capacity says, also when the
/// frame carried IP options, so that its payload starts later in an mbuf
/// sized for the MTU's frames (net_af_xdp above 1500 bytes, a NIC's
/// jumbo frames).
#[test]
fn a_received_datagram_grows_to_its_capacity_behind_ip_options() {
    let eal = eal("0");
    let (us, kernel) = (Ipv4Addr::new(10, 61, 0, 2), Ipv4Addr::new(10, 61, 0, 1));
    let veth = VethNs::new(61, kernel);
    sh(&format!("ip -n {} link set ainfx61b mtu 3000", veth.ns));
    let mut cfg = RuntimeConfig::new(&format!("net_af_xdp0,iface={}", veth.ours), us, 24);
    cfg.mtu = Some(3000);
    let run = Running::start(&eal, &cfg, |_| {
        let mut s = Services::new();
        s.listen(7, Box::new(GrowToCapacity));
        s
    });
    // The kernel adds 8 bytes of IP options (NOPs, then end of list).
    let reply = sh_out(&format!(
        "ip netns exec {} python3 -c '
import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, bytes([1] * 7 + [0]))
s.settimeout(0.5)
for _ in range(10):
    s.sendto(b\"grow\", (\"{us}\", 7))
    try:
        d = s.recv(65536)
        print(len(d), struct.unpack(\">I\", d[:4])[0])
        break
    except socket.timeout:
        pass
'",
        veth.ns
    ));
    drop(run.finish());
    let mut words = reply
        .split_whitespace()
        .map(|w| w.parse::<usize>().unwrap());
    let len = words.next().expect("a reply");
    let capacity = words.next().expect("its capacity");
    assert_eq!(len, capacity, "the reply is as long as its capacity said");
    assert!(capacity > 2900, "a payload near the MTU: {capacity}");
}
