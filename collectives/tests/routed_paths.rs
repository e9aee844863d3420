//! Two ranks over kernel UDP with a router between them (network
//! namespaces, nftables).
//!
//! - The router is rank 0's NAT, and rebinds it to another outside port
//!   while the ranks run all-reduces, as a NAT does when it restarts or a
//!   mapping expires: QUIC follows rank 0 there, and so must the
//!   communicator's view of it. Packets rank 1 still sends to the old
//!   port draw ICMP port unreachable from rank 0's host, which must not
//!   be taken for rank 0's death.
//! - The router drops big packets without a word: a collective that
//!   cannot move its data must fail, not wait forever.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use collectives::driver::{Communicator, DriverConfig, RankEnv};
use collectives::{Error, ReduceOp};

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
/// and `{name}b` (rank 1); removed on drop. The ranks' veths segment UDP
/// GSO sends themselves, as a NIC does before the wire, so the router's
/// rules see each datagram, not a batch.
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
             ip netns exec {n}a ethtool -K {n}a0 tx-udp-segmentation off
             ip -n {n}a route add default via 10.67.1.1
             ip -n {n}b addr add {RANK1}/24 dev {n}b0
             ip -n {n}b link set {n}b0 up
             ip netns exec {n}b ethtool -K {n}b0 tx-udp-segmentation off
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

    /// The router drops (and counts) every UDP datagram from `from`
    /// longer than `bytes` (header included), and says nothing.
    fn drop_udp_longer_than(&self, from: Ipv4Addr, bytes: u16) {
        sh(&format!(
            "ip netns exec {}r nft -f - <<'EOF'
table ip filter {{
    chain forward {{
        type filter hook forward priority 0;
        ip saddr {from} udp length > {bytes} counter drop
    }}
}}
EOF",
            self.name
        ));
    }

    /// What `drop_udp_longer_than` dropped.
    fn dropped(&self) -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", &format!("{}r", self.name)])
            .args(["nft", "list", "table", "ip", "filter"])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&out.stdout);
        out.split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
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
                lane: collectives::driver::Lane::ONLY,
                job: None,
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

/// Ranks whose path MTU discovery is off send the 1472-byte packets their
/// 1500-byte links carry, and the router drops everything over 1300 bytes
/// that rank 0 sends (a tunnel on the way out whose ICMP is filtered).
/// Rank 1's packets all arrive, so rank 0 keeps hearing it; only rank 0's
/// data never arrives, and nothing it sends is acknowledged. Rank 0 must
/// fail the all-reduce within about its timeout, naming the stall, and
/// rank 1 (whose own timeout is longer) must hear of it, instead of both
/// waiting for ever.
#[test]
fn a_collective_whose_packets_the_path_drops_fails_instead_of_waiting() {
    let net = Net::up("ainfcs");
    net.drop_udp_longer_than(RANK0, 1300);
    let timeouts = [Duration::from_secs(3), Duration::from_secs(20)];
    let started = std::time::Instant::now();
    let (done, ended) = mpsc::channel();
    for rank in 0..2 {
        let done = done.clone();
        std::thread::spawn(move || {
            let ns = ["ainfcsa", "ainfcsb"][rank];
            let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let peers = vec![
                SocketAddrV4::new(RANK0, PORT0),
                SocketAddrV4::new(RANK1, PORT1),
            ];
            let mut cfg = DriverConfig {
                timeout: timeouts[rank],
                ..DriverConfig::default()
            };
            cfg.quic.discover_pmtu = false;
            let mut c = Communicator::new(rank, 2, peers, cfg).unwrap();
            let mut buf: Vec<f32> = (0..COUNT).map(|i| value(rank, i)).collect();
            let result = c.all_reduce(&mut buf, ReduceOp::Sum);
            done.send((rank, result, started.elapsed())).unwrap();
        });
    }
    let mut ends = [None, None];
    for _ in 0..2 {
        let (rank, result, after) = ended
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("still waiting after 30 s: {ends:?}"));
        eprintln!("rank {rank} after {after:?}: {result:?}");
        ends[rank] = Some((result, after));
    }
    assert!(net.dropped() > 0, "the router dropped rank 0's big packets");
    let [Some((end0, after0)), Some((end1, after1))] = ends else {
        unreachable!()
    };
    assert!(
        matches!(end0, Err(Error::PeerStalled { rank: 1, .. })),
        "rank 0: {end0:?}"
    );
    assert!(
        after0 >= timeouts[0] && after0 < timeouts[0] * 2,
        "rank 0 failed after {after0:?}, its timeout is {:?}",
        timeouts[0]
    );
    assert!(
        matches!(
            end1,
            Err(Error::PeerLeft {
                rank: 0,
                failed: true,
                ..
            } | Error::PeerClosed { rank: 0, .. })
        ),
        "rank 1: {end1:?}"
    );
    assert!(
        after1 < after0 + Duration::from_secs(2),
        "rank 1 heard of rank 0's failure at once: {after1:?}"
    );
}

/// MASTER_ADDR is a service address on the router (a Kubernetes
/// ClusterIP, a load balancer) that forwards only the rendezvous's TCP
/// port to rank 0. Rank 0, bound to a wildcard, publishes its own
/// address, where the rendezvous's connections arrived, not the service
/// address, which forwards none of its QUIC traffic. (Nobody dials rank
/// 0 today, so only the table and the errors that name its address
/// would be wrong.)
#[test]
fn rank_0_behind_a_service_address_publishes_its_own() {
    const SERVICE: Ipv4Addr = Ipv4Addr::new(10, 67, 9, 9);
    let net = Net::up("ainfcv");
    sh(&format!(
        "ip netns exec ainfcvr nft -f - <<'EOF'
table ip svc {{
    chain pre {{
        type nat hook prerouting priority -100;
        ip daddr {SERVICE} tcp dport {MASTER_PORT} dnat to {RANK0}:{MASTER_PORT}
    }}
}}
EOF"
    ));
    let ranks: Vec<_> = [("ainfcva", Ipv4Addr::UNSPECIFIED), ("ainfcvb", RANK1)]
        .into_iter()
        .enumerate()
        .map(|(rank, (ns, ip))| {
            std::thread::spawn(move || {
                let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
                nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                let env = RankEnv {
                    rank,
                    world: 2,
                    master_addr: SERVICE.to_string(),
                    master_port: MASTER_PORT,
                    lane: collectives::driver::Lane::ONLY,
                    job: None,
                };
                let mine = SocketAddrV4::new(ip, [PORT0, PORT1][rank]);
                collectives::driver::rendezvous::exchange(&env, mine, Duration::from_secs(5))
                    .map(|(table, _)| table)
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    let tables: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    let want = vec![
        SocketAddrV4::new(RANK0, PORT0),
        SocketAddrV4::new(RANK1, PORT1),
    ];
    assert_eq!(tables, vec![Ok(want.clone()), Ok(want)]);
    drop(net);
}
