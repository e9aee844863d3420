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

use collectives::driver::{Communicator, DriverConfig, RankEnv};
use collectives::ReduceOp;

const RANK0: Ipv4Addr = Ipv4Addr::new(10, 67, 1, 2);
const RANK1: Ipv4Addr = Ipv4Addr::new(10, 67, 2, 2);
const PORT0: u16 = 47_000;
const PORT1: u16 = 47_001;
/// Rank 0's TCP rendezvous, when the ranks join through it.
const MASTER_PORT: u16 = 47_010;
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

/// Namespaces `{name}a` (rank 0), `{name}r` (the router, rank 0's NAT)
/// and `{name}b` (rank 1); removed on drop.
struct Net {
    name: &'static str,
}

impl Net {
    fn up(name: &'static str) -> Net {
        let net = Net { name };
        net.down();
        let n = name;
        sh(&format!(
            "set -e
             for x in {n}a {n}r {n}b; do ip netns add $x; ip -n $x link set lo up; done
             ip link add {n}a0 netns {n}a type veth peer name {n}r0 netns {n}r
             ip link add {n}b0 netns {n}b type veth peer name {n}r1 netns {n}r
             ip -n {n}a addr add {RANK0}/24 dev {n}a0
             ip -n {n}a link set {n}a0 up
             ip -n {n}a route add default via 10.67.1.1
             ip -n {n}b addr add {RANK1}/24 dev {n}b0
             ip -n {n}b link set {n}b0 up
             ip -n {n}b route add default via 10.67.2.1
             ip -n {n}r addr add 10.67.1.1/24 dev {n}r0
             ip -n {n}r addr add 10.67.2.1/24 dev {n}r1
             ip -n {n}r link set {n}r0 up
             ip -n {n}r link set {n}r1 up
             ip netns exec {n}r sysctl -qw net.ipv4.ip_forward=1"
        ));
        net
    }

    /// The router maps rank 0's UDP port to `outside` (stateless, both
    /// ways), replacing any earlier mapping.
    fn map_rank0_to(&self, outside: u16) {
        sh(&format!(
            "ip netns exec {}r nft -f - <<'EOF'
table ip nat
delete table ip nat
table ip nat {{
    chain pre {{
        type filter hook prerouting priority -300;
        ip saddr {RANK0} udp sport {PORT0} udp sport set {outside} notrack
        ip daddr {RANK0} udp dport {outside} udp dport set {PORT0} notrack
    }}
}}
EOF",
            self.name
        ));
    }

    fn down(&self) {
        let n = self.name;
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "for x in {n}a {n}r {n}b; do ip netns del $x 2>/dev/null; done; true"
            ))
            .status();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.down();
    }
}

fn value(rank: usize, i: usize) -> f32 {
    ((i * 7 + rank * 13) % 64) as f32 * 0.25 - 8.0
}

/// How the ranks find each other.
#[derive(Clone, Copy)]
enum Launch {
    /// Both are given the other's address (`Communicator::new`).
    Listed,
    /// Through rank 0's TCP rendezvous, whose connections stay open as
    /// the job's liveness links.
    Rendezvous,
}

/// The run: `collectives` all-reduces; rank 0's NAT moves it after every
/// `per_mapping`, while rank 0 is held back for `hold`. With
/// `big_datagrams`, the ranks' sockets allow 32 KiB datagrams and path MTU
/// discovery is off: each connection must take its size from its route
/// (the 1500-byte veths), or every full-size packet is lost (sends are DF).
#[derive(Clone, Copy)]
struct Plan {
    launch: Launch,
    collectives: usize,
    per_mapping: usize,
    hold: Duration,
    big_datagrams: bool,
}

/// Rank `rank`, in namespace `ns`, runs the plan's all-reduces and checks
/// each result. Rank 0 asks for a rebinding (`rebind`) after every
/// `per_mapping` and waits until it is done (`rebound`), so rank 1 starts
/// the next collective first and sends to rank 0's old port. Returns
/// where its connection to the other rank sends at the end, or the first
/// error or wrong element.
fn run_rank(
    rank: usize,
    ns: String,
    plan: Plan,
    rebind: mpsc::Sender<()>,
    rebound: mpsc::Receiver<()>,
) -> Result<SocketAddrV4, String> {
    let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
    let peers = [
        SocketAddrV4::new(RANK0, PORT0),
        SocketAddrV4::new(RANK1, PORT1),
    ];
    let mut cfg = DriverConfig {
        timeout: Duration::from_secs(5),
        ..DriverConfig::default()
    };
    if plan.big_datagrams {
        cfg.udp.max_payload = 32 << 10;
        cfg.quic.discover_pmtu = false;
    }
    let joined = match plan.launch {
        Launch::Listed => Communicator::new(rank, 2, peers.to_vec(), cfg),
        Launch::Rendezvous => {
            let env = RankEnv {
                rank,
                world: 2,
                master_addr: RANK0.to_string(),
                master_port: MASTER_PORT,
            };
            Communicator::from_env_bound(&env, peers[rank], cfg)
        }
    };
    let mut c = joined.map_err(|e| e.to_string())?;
    let mut buf = vec![0f32; COUNT];
    for n in 0..plan.collectives {
        if rank == 0 && n > 0 && n % plan.per_mapping == 0 {
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

/// Runs `plan` in namespaces named after `name`; asserts every collective
/// completed with the right result on both ranks, and that rank 1 ends
/// up sending to rank 0's last outside port.
fn all_reduces_through_rebindings(name: &'static str, plan: Plan) {
    let net = Net::up(name);
    net.map_rank0_to(40_001);
    let (rebind, rebind_asked) = mpsc::channel();
    let (rebound_tx, rebound) = mpsc::channel();
    let rank0 = std::thread::spawn(move || run_rank(0, format!("{name}a"), plan, rebind, rebound));
    let (unused_tx, unused_rx) = mpsc::channel();
    let rank1 =
        std::thread::spawn(move || run_rank(1, format!("{name}b"), plan, unused_tx, unused_rx));
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
        std::thread::sleep(plan.hold);
        rebound_tx.send(()).unwrap();
    }
    let results = [rank0.join().unwrap(), rank1.join().unwrap()];
    assert!(
        results.iter().all(|r| r.is_ok()),
        "rank 0: {:?}; rank 1: {:?}",
        results[0],
        results[1]
    );
    let rebindings = (plan.collectives - 1) / plan.per_mapping;
    assert_eq!(last, 40_001 + rebindings as u16);
    assert_eq!(
        results[1],
        Ok(SocketAddrV4::new(RANK0, last)),
        "rank 1 sends to rank 0's last outside port"
    );
    assert_eq!(results[0], Ok(SocketAddrV4::new(RANK1, PORT1)));
}

/// Ranks given each other's addresses: rank 0 is held back 300 ms each
/// time, within the second a rank found at a closed port has to speak.
/// Their sockets are made for 32 KiB datagrams, which the path does not
/// carry.
#[test]
fn all_reduces_go_on_while_a_nat_rebinds_a_rank() {
    all_reduces_through_rebindings(
        "ainfcn",
        Plan {
            launch: Launch::Listed,
            collectives: 21,
            per_mapping: 3,
            hold: Duration::from_millis(300),
            big_datagrams: true,
        },
    );
}

/// Ranks joined through the rendezvous: its liveness links say whether a
/// rank lives, so a closed UDP port does not count, and rank 0 may stay
/// away longer after a rebinding (a trainer computing) than the second
/// allowed without the links.
#[test]
fn with_liveness_links_a_moved_rank_may_compute_for_long() {
    all_reduces_through_rebindings(
        "ainfcw",
        Plan {
            launch: Launch::Rendezvous,
            collectives: 7,
            per_mapping: 3,
            hold: Duration::from_millis(2500),
            big_datagrams: false,
        },
    );
}
