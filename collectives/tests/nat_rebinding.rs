//! Two ranks over kernel UDP with a router between them that is rank 0's
//! NAT (network namespaces, nftables). The NAT rebinds rank 0 to another
//! outside port while the ranks run all-reduces, as a NAT does when it
//! restarts or a mapping expires: QUIC follows rank 0 there, and so must
//! the communicator's view of it. Packets rank 1 still sends to the old
//! port draw ICMP port unreachable from rank 0's host, which must not be
//! taken for rank 0's death.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use collectives::driver::{Communicator, DriverConfig};
use collectives::ReduceOp;

const RANK0: Ipv4Addr = Ipv4Addr::new(10, 67, 1, 2);
const RANK1: Ipv4Addr = Ipv4Addr::new(10, 67, 2, 2);
const PORT0: u16 = 47_000;
const PORT1: u16 = 47_001;
/// Elements per all-reduce (4 MiB).
const COUNT: usize = 1 << 20;

fn sh(cmd: &str) {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Namespaces `{N}a` (rank 0), `{N}r` (the router, rank 0's NAT) and
/// `{N}b` (rank 1); removed on drop.
struct Net;

const N: &str = "ainfcn";

impl Net {
    fn up() -> Net {
        Net::down();
        sh(&format!(
            "set -e
             for n in {N}a {N}r {N}b; do ip netns add $n; ip -n $n link set lo up; done
             ip link add {N}a0 netns {N}a type veth peer name {N}r0 netns {N}r
             ip link add {N}b0 netns {N}b type veth peer name {N}r1 netns {N}r
             ip -n {N}a addr add {RANK0}/24 dev {N}a0
             ip -n {N}a link set {N}a0 up
             ip -n {N}a route add default via 10.67.1.1
             ip -n {N}b addr add {RANK1}/24 dev {N}b0
             ip -n {N}b link set {N}b0 up
             ip -n {N}b route add default via 10.67.2.1
             ip -n {N}r addr add 10.67.1.1/24 dev {N}r0
             ip -n {N}r addr add 10.67.2.1/24 dev {N}r1
             ip -n {N}r link set {N}r0 up
             ip -n {N}r link set {N}r1 up
             ip netns exec {N}r sysctl -qw net.ipv4.ip_forward=1"
        ));
        Net
    }

    /// The router maps rank 0's port to `outside` (stateless, both ways),
    /// replacing any earlier mapping.
    fn map_rank0_to(&self, outside: u16) {
        sh(&format!(
            "ip netns exec {N}r nft -f - <<'EOF'
table ip nat
delete table ip nat
table ip nat {{
    chain pre {{
        type filter hook prerouting priority -300;
        ip saddr {RANK0} udp sport {PORT0} udp sport set {outside} notrack
        ip daddr {RANK0} udp dport {outside} udp dport set {PORT0} notrack
    }}
}}
EOF"
        ));
    }

    fn down() {
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "for x in {N}a {N}r {N}b; do ip netns del $x 2>/dev/null; done; true"
            ))
            .status();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        Net::down();
    }
}

fn value(rank: usize, i: usize) -> f32 {
    ((i * 7 + rank * 13) % 64) as f32 * 0.25 - 8.0
}

/// All-reduces each rank runs; rank 0's NAT rebinds it after every
/// `PER_MAPPING` of them.
const COLLECTIVES: usize = 21;
const PER_MAPPING: usize = 3;

/// Rank `rank`, in namespace `ns`, runs `COLLECTIVES` all-reduces and
/// checks each result. Rank 0 asks for a rebinding (`rebind`) after every
/// `PER_MAPPING` and waits until it is done (`rebound`), so rank 1 starts
/// the next collective first and sends to rank 0's old port. Returns
/// where its connection to the other rank sends at the end, or the first
/// error or wrong element.
fn run_rank(
    rank: usize,
    ns: String,
    rebind: mpsc::Sender<()>,
    rebound: mpsc::Receiver<()>,
) -> Result<SocketAddrV4, String> {
    let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
    let peers = vec![
        SocketAddrV4::new(RANK0, PORT0),
        SocketAddrV4::new(RANK1, PORT1),
    ];
    let cfg = DriverConfig {
        timeout: Duration::from_secs(5),
        ..DriverConfig::default()
    };
    let mut c = Communicator::new(rank, 2, peers, cfg).map_err(|e| e.to_string())?;
    let mut buf = vec![0f32; COUNT];
    for n in 0..COLLECTIVES {
        if rank == 0 && n > 0 && n % PER_MAPPING == 0 {
            rebind.send(()).unwrap();
            rebound.recv().unwrap();
        }
        for (i, x) in buf.iter_mut().enumerate() {
            *x = value(rank, i);
        }
        c.all_reduce(&mut buf, ReduceOp::Sum)
            .map_err(|e| format!("collective {n}: {e}"))?;
        if let Some(i) = (0..COUNT).find(|&i| buf[i] != value(0, i) + value(1, i)) {
            return Err(format!("collective {n}: element {i} is {}", buf[i]));
        }
    }
    Ok(c.peer_addr(1 - rank))
}

#[test]
fn all_reduces_go_on_while_a_nat_rebinds_a_rank() {
    let net = Net::up();
    net.map_rank0_to(40_001);
    let (rebind, rebind_asked) = mpsc::channel();
    let (rebound_tx, rebound) = mpsc::channel();
    let rank0 = std::thread::spawn(move || run_rank(0, format!("{N}a"), rebind, rebound));
    let (unused_tx, unused_rx) = mpsc::channel();
    let rank1 = std::thread::spawn(move || run_rank(1, format!("{N}b"), unused_tx, unused_rx));
    // Rebind each time rank 0 asks; it stops asking when it ends.
    let mut last = 40_001;
    for outside in 40_002.. {
        if rebind_asked.recv_timeout(Duration::from_secs(60)).is_err() {
            break;
        }
        net.map_rank0_to(outside);
        last = outside;
        // Meanwhile rank 1 is in the next collective, and its packets and
        // probes go to the old port.
        std::thread::sleep(Duration::from_millis(300));
        rebound_tx.send(()).unwrap();
    }
    let results = [rank0.join().unwrap(), rank1.join().unwrap()];
    assert!(
        results.iter().all(|r| r.is_ok()),
        "rank 0: {:?}; rank 1: {:?}",
        results[0],
        results[1]
    );
    assert_eq!(last, 40_001 + (COLLECTIVES - 1) as u16 / PER_MAPPING as u16);
    assert_eq!(
        results[1],
        Ok(SocketAddrV4::new(RANK0, last)),
        "rank 1 sends to rank 0's last outside port"
    );
    assert_eq!(results[0], Ok(SocketAddrV4::new(RANK1, PORT1)));
}
