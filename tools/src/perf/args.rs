//! ainftp-perf's command line.

use clap::builder::TypedValueParser;
use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Forward packets unchanged from each port to its peer port.
    Io,
    /// Swap source and destination MAC, then forward to the peer port.
    Macswap,
    /// Receive and free.
    Rxonly,
    /// Generate UDP/IPv4 packets of --pkt-size bytes.
    Txonly,
    /// UDP echo server on kernel sockets (--bind), the stack's echo
    /// service over its kernel UDP backend: the baseline ainftp-dp's
    /// echo is compared with.
    UdpEcho,
    /// UDP ping-pong client on a kernel socket (--target): round-trip
    /// latency percentiles from an HDR histogram.
    UdpPingpong,
    /// QUIC perf-protocol server (ALPN ainftp-perf/1) on --bind, over
    /// --transport udp (kernel sockets) or dpdk (our stack).
    QuicServer,
    /// QUIC client against --target: --test bulk (goodput) or rr (latency).
    QuicClient,
    /// Kernel TCP bulk server on --bind: the baseline for QUIC goodput.
    TcpServer,
    /// Kernel TCP bulk client against --target (--bytes on --conns).
    TcpClient,
    /// GPU copy bandwidth (registered hugepage arena vs cuMemHostAlloc vs
    /// pageable, each way) and codec kernel throughput vs a device copy.
    Gpu,
    /// All-reduce over QUIC between ranks (nccl-tests style; see -b/-e/-f,
    /// --local-ranks or the torchrun environment).
    #[value(alias = "all_reduce", alias = "all-reduce")]
    Allreduce,
    /// Reduce-scatter over QUIC (same flags as allreduce).
    #[value(alias = "reduce_scatter", alias = "reducescatter")]
    ReduceScatter,
    /// All-gather over QUIC (same flags as allreduce).
    #[value(alias = "all_gather", alias = "all-gather")]
    Allgather,
    /// Broadcast from rank 0 over QUIC (same flags as allreduce).
    Broadcast,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Io => "io",
            Mode::Macswap => "macswap",
            Mode::Rxonly => "rxonly",
            Mode::Txonly => "txonly",
            Mode::UdpEcho => "udp-echo",
            Mode::UdpPingpong => "udp-pingpong",
            Mode::QuicServer => "quic-server",
            Mode::QuicClient => "quic-client",
            Mode::TcpServer => "tcp-server",
            Mode::TcpClient => "tcp-client",
            Mode::Gpu => "gpu",
            Mode::Allreduce => "allreduce",
            Mode::ReduceScatter => "reduce-scatter",
            Mode::Allgather => "allgather",
            Mode::Broadcast => "broadcast",
        }
    }

    /// A collective mode (runs over QUIC, not on DPDK ports).
    pub fn is_collective(self) -> bool {
        matches!(
            self,
            Mode::Allreduce | Mode::ReduceScatter | Mode::Allgather | Mode::Broadcast
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CollOp {
    Sum,
    Avg,
    Max,
    Min,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CollCodec {
    /// Exact f32 on the wire.
    F32,
    /// i16 with a per-chunk scale (half the bytes; bounded error).
    I16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CollAlgo {
    Auto,
    Ring,
    Direct,
    /// Recursive doubling.
    Rd,
}

/// Element type of the collectives' buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CollDtype {
    F32,
    /// bfloat16: reduced in f32 (on the wire: --codec), rounded back once.
    Bf16,
}

/// Where a rank's collectives make progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CollProgress {
    /// In the caller's thread, inside the calls (nothing moves while the
    /// caller computes).
    Caller,
    /// On a progress thread of the rank's own (collectives::driver::Background):
    /// the caller hands a bucket over and is woken when it is reduced.
    Thread,
}

/// What carries QUIC's datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// Kernel UDP sockets (GSO/GRO where the kernel has them).
    Udp,
    /// ainftp's user-space stack on a DPDK port (--vdev/--pci, --ip).
    Dpdk,
}

impl Transport {
    /// The flag value that selects it.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Dpdk => "dpdk",
        }
    }
}

/// What quic-client measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QuicTest {
    /// Upload --bytes on each of --streams streams of --conns connections.
    Bulk,
    /// Request/response: --size-byte echoes, one stream each, one at a
    /// time per lcore, over the --conns connections in turn.
    Rr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IdlePolicy {
    /// Spin without pause: lowest latency, one core at 100% always.
    Busy,
    /// Spin, then rte_pause, then short sleeps while no packet arrives.
    Adaptive,
}

impl From<IdlePolicy> for stack::runtime::IdlePolicy {
    fn from(p: IdlePolicy) -> Self {
        match p {
            IdlePolicy::Busy => stack::runtime::IdlePolicy::Busy,
            IdlePolicy::Adaptive => stack::runtime::IdlePolicy::Adaptive,
        }
    }
}

/// ainftp's perf tool: testpmd-style packet forwarding on DPDK ports
/// (io, macswap, rxonly, txonly), UDP echo and ping-pong latency, QUIC and
/// TCP goodput and latency, and nccl-tests-style collectives (allreduce,
/// reduce-scatter, allgather, broadcast) to compare with Gloo.
///
/// Packet modes: ports are paired 0<->1, 2<->3 (an odd last port forwards
/// to itself); the first lcore prints statistics, the others forward (a
/// single lcore does both). Extra EAL arguments go after `--`.
#[derive(Debug, Parser)]
#[command(
    name = "ainftp-perf",
    version,
    // Examples are kept under 80 columns: clap would wrap longer lines
    // mid-command, and copied, they would break.
    after_help = "Examples:\n  \
ainftp-perf io --vdev net_null0 --vdev net_null1 --lcores 0-1 --duration 5\n  \
ainftp-perf txonly --vdev net_tap0,iface=dtap0 --pkt-size 128 --json\n  \
ainftp-perf rxonly --pci 0000:3b:00.0 --lcores 2-7 --queues 5\n  \
ainftp-perf quic-server --transport dpdk --vdev net_af_xdp0,iface=veth1 \\\n      \
--ip 10.0.0.2/24 --bind 10.0.0.2:4433\n  \
ainftp-perf quic-client --transport udp --target 10.0.0.2:4433 \\\n      \
--test bulk --conns 2 --streams 4 --bytes 100000000\n  \
ainftp-perf quic-client --transport dpdk --vdev net_tap0,iface=qtap0 \\\n      \
--ip 10.0.0.3/24 --lcores 0-1 --target 10.0.0.1:4433 --conns 4\n  \
ainftp-perf tcp-server --bind 10.0.0.2:5201\n  \
ainftp-perf tcp-client --target 10.0.0.2:5201 --bytes 1000000000\n  \
ainftp-perf allreduce --local-ranks 4 --transport udp -b 8 -e 64M -f 4 \\\n      \
--codec i16\n  \
RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 \\\n      \
ainftp-perf allreduce -e 1G"
)]
pub struct PerfArgs {
    /// What to run: a testpmd-style forwarding mode on DPDK ports (io,
    /// macswap, rxonly, txonly), a latency or goodput test, or a
    /// collective.
    #[arg(value_enum)]
    pub mode: Mode,

    /// PCI device to use (repeatable), e.g. 0000:3b:00.0.
    #[arg(long = "pci", value_name = "BDF", value_parser = crate::eal_setup::parse_pci)]
    pub pci: Vec<String>,

    /// Virtual device to create (repeatable), e.g. net_null0 or net_af_xdp0,iface=veth0.
    #[arg(long = "vdev", value_name = "SPEC")]
    pub vdev: Vec<String>,

    /// Lcores in DPDK syntax (2-7, 0,2,4). Default: the first two CPUs this
    /// process may run on (quic-*: the first one; collectives: one CPU per
    /// lane, in order, see --lanes).
    #[arg(long, value_name = "LIST")]
    pub lcores: Option<String>,

    /// Rx and tx queues per port, spread over the forwarding lcores.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub queues: u16,

    /// Packets per rx/tx burst.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=512))]
    pub burst: u16,

    /// txonly packet size in bytes (Ethernet frame without CRC).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(60..=2048))]
    pub pkt_size: u16,

    /// Seconds to run: packet modes (default 10) and servers (default: until
    /// Ctrl-C or SIGTERM, as iperf3 -s; 0 too). Clients end when their
    /// --count or --bytes is done.
    #[arg(long, value_parser = crate::seconds::parse, allow_negative_numbers = true)]
    pub duration: Option<f64>,

    /// Seconds between statistics prints (0: only the summary).
    #[arg(long, default_value_t = 1.0, value_parser = crate::seconds::parse, allow_negative_numbers = true)]
    pub stats_period: f64,

    /// Idle behaviour of the forwarding loops.
    #[arg(long, value_enum, default_value_t = IdlePolicy::Adaptive)]
    pub idle: IdlePolicy,

    /// --transport dpdk on several lcores: how flows reach them. auto (RSS
    /// if the PMD has it, else software), rss, software. QUIC packets that
    /// reach another lcore than their connection's are handed to it by
    /// connection ID; a quic-client avoids that where it knows where
    /// replies land (software steering, or RSS it can read).
    #[arg(long, value_name = "MODE", value_parser = parse_steering, default_value = "auto")]
    pub steering: stack::runtime::SteeringMode,

    /// With --transport dpdk: packet buffers in a hugepage arena registered
    /// with DPDK and CUDA (host-only without a GPU), so payloads land in
    /// memory the GPU reaches. Not with net_af_xdp; --local-ranks then gives
    /// each rank net_af_packet instead.
    #[arg(long)]
    pub mbuf_arena: bool,

    /// Rx/tx descriptors per queue (0: the PMD's preferred size).
    #[arg(long, default_value_t = 0)]
    pub descriptors: u16,

    /// Destination MAC of txonly packets (default 02:00:00:00:00:<peer port>).
    #[arg(long, value_name = "MAC")]
    pub eth_peer: Option<String>,

    /// io/macswap: send one burst of txonly packets on each stream first,
    /// to start traffic circulating on a loop (veth pair, memif), as
    /// testpmd's --tx-first does.
    #[arg(long)]
    pub tx_first: bool,

    /// Seconds to wait for every port's link to come up before forwarding.
    #[arg(long, default_value_t = 10.0, value_parser = crate::seconds::parse, allow_negative_numbers = true)]
    pub link_wait: f64,

    /// udp-echo, quic-server, tcp-server: IPv4 address and port to serve
    /// on, e.g. 10.0.0.1:7 (port 0: any free port, printed at start).
    #[arg(long, value_name = "ADDR:PORT")]
    pub bind: Option<String>,

    /// udp-pingpong, quic-client, tcp-client: the server to measure, an
    /// IPv4 address and port, e.g. 10.0.0.2:7.
    #[arg(long, value_name = "ADDR:PORT")]
    pub target: Option<String>,

    /// udp-pingpong, quic-client --test rr: round trips to measure (after
    /// --warmup ones).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub count: u64,

    /// udp-pingpong, quic-client --test rr: round trips before measuring.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(..=1_000_000_000))]
    pub warmup: u64,

    /// udp-pingpong: UDP payload bytes per datagram (>= 8); quic-client
    /// --test rr: request bytes.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(8..=65000))]
    pub size: u16,

    /// quic-*, collectives: what carries QUIC's datagrams.
    #[arg(long, value_enum, default_value_t = Transport::Udp)]
    pub transport: Transport,

    /// quic-*, collectives, --transport dpdk: our address on the port, e.g.
    /// 10.0.0.2/24. Collectives with --lanes N take N ports and one --ip
    /// per port, in the order of the ports.
    #[arg(long, value_name = "ADDR/N")]
    pub ip: Vec<String>,

    /// quic-*, collectives, --transport dpdk: the router for destinations
    /// outside --ip's subnet (none: only the subnet is reachable). One for
    /// every port, or one per --ip, in their order.
    #[arg(long, value_name = "ADDR")]
    pub gateway: Vec<String>,

    /// quic-client: bulk goodput or request/response latency.
    #[arg(long, value_enum, default_value_t = QuicTest::Bulk)]
    pub test: QuicTest,

    /// quic-client, tcp-client: connections (quic rr: the requests take
    /// them in turn, one request at a time per lcore).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=MAX_CONNS as u64).map(|n| n as usize))]
    pub conns: usize,

    /// quic-client: seconds a handshake may take before the run fails
    /// (nobody listening, a wrong address, a dropped path; 0: no limit)
    /// [default: 10]. tcp-client: seconds the connect, and then each send,
    /// may stall, and the server's answer that long past the time the
    /// sends took (0: no limit) [default: 10].
    /// Collectives: seconds for every rank to join, the rendezvous and the
    /// connections (more than 0) [default: 60].
    #[arg(long, value_name = "SECS", value_parser = crate::seconds::parse, allow_negative_numbers = true)]
    pub connect_timeout: Option<f64>,

    /// quic-client: streams per connection (bulk).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1024).map(|n| n as usize))]
    pub streams: usize,

    /// quic-client, tcp-client: bytes to upload per stream (per connection for
    /// TCP); gpu: bytes per copy (and f32 bytes through the codec).
    #[arg(long, default_value_t = 100_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub bytes: u64,

    /// quic-*, collectives: cluster certificates, mutual TLS (make them
    /// with ainftp-dp certs: quic-* use the nodes `server` and `client`,
    /// rank R of a collective the node `rankR`). Without: throwaway
    /// certificates and no verification (benchmarks only).
    #[arg(long, value_name = "DIR")]
    pub certs: Option<std::path::PathBuf>,

    /// quic-*: largest UDP payload. Default: follow the link. On DPDK the
    /// port's MTU - 28 (jumbo frames when the port has them); over kernel
    /// UDP the client takes the MTU of its route to --target - 28, at most
    /// 32 KiB, and the server accepts up to 32 KiB and sends what each
    /// client says it takes. Given: that size, capped by the device's.
    /// QUIC needs datagrams of at least 1200 bytes.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1200..=65507))]
    pub max_payload: Option<u32>,

    /// --transport dpdk: the port's MTU (jumbo frames, e.g. 9000, where the
    /// device allows; mbufs are sized to hold a whole frame). Default: the
    /// device's; with --local-ranks, the virtual links' MTU, by default the
    /// largest net_af_xdp takes (3438; 1500 with --mbuf-arena). At least
    /// 1228: QUIC sends 1200-byte datagrams, and the stack does not
    /// fragment.
    #[arg(long, value_parser = clap::value_parser!(u16).range(MIN_QUIC_MTU as i64..))]
    pub mtu: Option<u16>,

    /// Print one JSON summary object as the last line (collectives: one
    /// JSON object per size).
    #[arg(long)]
    pub json: bool,

    /// Collectives: smallest buffer in bytes (suffixes K, M, G).
    #[arg(short = 'b', long, default_value = "8", value_parser = parse_bytes)]
    pub minbytes: u64,

    /// Collectives: largest buffer in bytes (suffixes K, M, G).
    #[arg(short = 'e', long, default_value = "32M", value_parser = parse_bytes)]
    pub maxbytes: u64,

    /// Collectives: size multiplier between rows.
    #[arg(short = 'f', long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..))]
    pub stepfactor: u64,

    /// Collectives: timed iterations per size; gpu: timed copies / kernel runs.
    #[arg(short = 'n', long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: u64,

    /// Collectives: untimed iterations per size first.
    #[arg(short = 'w', long, default_value_t = 5)]
    pub warmup_iters: u64,

    /// Collectives: reduction.
    #[arg(long, value_enum, default_value_t = CollOp::Sum)]
    pub op: CollOp,

    /// Collectives: wire codec.
    #[arg(long, value_enum, default_value_t = CollCodec::F32)]
    pub codec: CollCodec,

    /// Collectives with --codec i16: the clip policy's bound C on honest
    /// per-element magnitudes (e.g. the gradient-clipping value). Each rank
    /// clamps its contribution to [-C, C] and every receiver clamps what a
    /// message may carry to k*C (k: contributions it must hold), so no peer
    /// can force a scale above N*C/32767 on the others. Default: no clip.
    #[arg(long, value_name = "C", value_parser = parse_clip)]
    pub clip: Option<f32>,

    /// Collectives: algorithm (auto: recursive doubling up to 64 KiB, ring above).
    #[arg(long, value_enum, default_value_t = CollAlgo::Auto)]
    pub algo: CollAlgo,

    /// Collectives: element type of the buffers (sizes are in bytes of it).
    #[arg(long, value_enum, default_value_t = CollDtype::F32)]
    pub dtype: CollDtype,

    /// Collectives: where the collectives make progress (thread: a
    /// progress thread per rank, on lane 0's CPU when pinned).
    #[arg(long, value_enum, default_value_t = CollProgress::Caller)]
    pub progress: CollProgress,

    /// Collectives: microseconds of simulated computation (a sleep, as a
    /// CPU waiting on its GPU) in every timed iteration, between handing
    /// the buffer to the communicator and needing the result; time_us is
    /// then the whole step. With --progress caller the collective runs
    /// after it (nothing moves meanwhile), with thread during it.
    #[arg(long, value_name = "US", default_value_t = 0)]
    pub overlap_us: u64,

    /// Collectives: start N ranks as child processes on this host
    /// (rendezvous on 127.0.0.1). Without it, one rank per process from
    /// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (the rendezvous port;
    /// AINFTP_RDV_PORT overrides it, and under torchrun's agent store,
    /// which holds MASTER_PORT, it is MASTER_PORT + 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub local_ranks: Option<u16>,

    /// Collectives over kernel UDP: UDP payload bytes per datagram (1472
    /// fits a 1500-byte MTU; up to 65507 on loopback or jumbo frames).
    /// Default: the MTU of the route to MASTER_ADDR minus 28, at most
    /// 32768 (loopback: 32768; a 1500-byte Ethernet: 1472).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1200..=65507))]
    pub udp_payload: Option<u16>,

    /// Collectives: microseconds the poll loop spins without traffic
    /// before sleeping in poll(2) (spinning costs a core per rank).
    /// Default: 50, or 0 when --local-ranks runs more ranks x lanes than
    /// this process may use CPUs (spinners would take the CPU their peers
    /// need).
    #[arg(long)]
    pub spin_us: Option<u64>,

    /// quic-*, collectives: QUIC congestion control (quiche's names; bbr
    /// and bbr2 are both its bbr2_gcongestion).
    #[arg(long, default_value = "cubic", value_parser = ["cubic", "reno", "bbr2", "bbr", "bbr2_gcongestion"])]
    pub cc: String,

    /// quic-*, collectives: pace sends over the round trip (quiche's
    /// pacing: each packet waits for the send time quiche gives it).
    #[arg(long)]
    pub pacing: bool,

    /// Collectives: QUIC connections per peer (messages are striped).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub conns_per_peer: u16,

    /// Collectives: lanes per rank. A large bucket (any op but barrier) is
    /// split over this many communicators, each with its own UDP socket
    /// (--transport dpdk: its own port, the k-th of --pci then --vdev, with
    /// the k-th --ip), QUIC connections and thread (pinned to its own CPU
    /// with --local-ranks, else to the k-th CPU of --lcores, which then
    /// names one per lane; on DPDK by default the first CPUs it may run on;
    /// the rendezvous port + k is lane k's). Every rank must use the
    /// same value.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub lanes: u16,

    /// Collectives with --lanes: a bucket is split over as many lanes as
    /// get at least this many bytes each, once that is 4 lanes or all of
    /// them (suffixes K, M, G). Every rank must use the same value.
    #[arg(long, value_name = "BYTES", default_value = "1M", value_parser = parse_bytes)]
    pub lane_min_bytes: u64,

    /// Collectives: seconds a peer may stay silent in a collective before
    /// it fails with an error naming that peer; also how long a collective
    /// may make no progress at all (a rank that is alive but has not
    /// entered it).
    #[arg(long, default_value_t = 30.0, value_parser = crate::seconds::parse, allow_negative_numbers = true)]
    pub timeout: f64,

    /// Fault injection (tests): this rank exits right after connecting,
    /// without closing, as if it crashed.
    #[arg(long, hide = true, value_name = "RANK")]
    pub fault_exit_rank: Option<usize>,

    /// Fault injection (tests): this rank changes one element of each
    /// result before it is checked, as a wrong reduction would.
    #[arg(long, hide = true, value_name = "RANK")]
    pub fault_corrupt_rank: Option<usize>,

    /// Extra EAL arguments.
    #[arg(last = true, value_name = "EAL_ARGS")]
    pub eal_args: Vec<String>,
}

impl PerfArgs {
    /// Seconds a packet mode runs (`--duration`, default 10; 0: until a
    /// signal).
    pub fn packet_duration(&self) -> f64 {
        self.duration.unwrap_or(10.0)
    }

    /// Seconds a server runs (`--duration`; by default, and at 0, until a
    /// signal).
    pub fn server_duration(&self) -> f64 {
        self.duration.unwrap_or(0.0)
    }
}

/// Most `--conns`: tcp-client runs a thread per connection, and the QUIC
/// client's connection table is sized for far fewer.
pub const MAX_CONNS: usize = 1024;

/// The smallest port MTU QUIC runs on: a 1200-byte datagram (RFC 9000,
/// 14.1) and its IPv4 and UDP headers.
pub const MIN_QUIC_MTU: u16 = 1200 + 20 + 8;

/// The largest size `parse_bytes` takes (1 TiB); whether the buffers fit
/// this machine is checked when a run starts.
pub const MAX_BYTES: u64 = 1 << 40;

/// `--clip`: a finite number above 0 (the engine refuses anything else).
fn parse_clip(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(c) if c > 0.0 && c.is_finite() => Ok(c),
        Ok(_) => Err(format!("'{s}' is not a finite number above 0")),
        Err(e) => Err(format!("'{s}': {e}")),
    }
}

/// `8`, `64K`, `128M`, `1G` (powers of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 8, 64K, 128M, 1G)"))?;
    let bytes = n
        .checked_mul(mul)
        .filter(|&b| b <= MAX_BYTES)
        .ok_or_else(|| format!("'{s}': sizes are at most 1024G"))?;
    if bytes < 4 {
        return Err(format!("'{s}': sizes must be at least 4 bytes (one f32)"));
    }
    Ok(bytes)
}

fn parse_steering(s: &str) -> Result<stack::runtime::SteeringMode, String> {
    s.parse()
}
