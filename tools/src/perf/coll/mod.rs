//! ainftp-perf's collective modes (allreduce, reduce-scatter, allgather,
//! broadcast): nccl-tests style rows over QUIC between ranks, checked
//! against known references.

pub mod check;
pub mod drive;
pub mod local;
pub mod vnet;

use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use collectives::driver::rendezvous::RankEnv;
use collectives::driver::{Backend, DriverConfig, DriverCounters, Lanes};
use collectives::{Algo, Codec, Collective, Config, Op, ReduceOp, Rounding};
use serde::Serialize;
use stack::io::kernel::KernelUdpConfig;
use stack::quic::certs::NodeFiles;
use stack::quic::QuicConfig;

use crate::error::{Error, Result};
use crate::perf::args::{
    CollAlgo, CollCodec, CollDtype, CollOp, CollProgress, Mode, PerfArgs, Transport,
};
use crate::perf::quic;

/// A backend lanes can run on (each lane's thread owns its backend).
pub trait LaneBackend: Backend + Send + 'static {}
impl<B: Backend + Send + 'static> LaneBackend for B {}

/// One output row (one buffer size).
#[derive(Debug, Serialize)]
pub struct Row {
    pub mode: &'static str,
    pub ranks: usize,
    pub bytes: u64,
    pub count: usize,
    #[serde(rename = "type")]
    pub ty: &'static str,
    pub codec: &'static str,
    pub op: &'static str,
    pub algo: &'static str,
    pub time_us: f64,
    /// Bandwidths of the collective; null with --overlap-us, whose
    /// time_us is the whole step (computation included).
    #[serde(rename = "algbw_GBs")]
    pub algbw: Option<f64>,
    #[serde(rename = "busbw_GBs")]
    pub busbw: Option<f64>,
    pub max_rel_err: f64,
    pub wrong: u64,
    /// Every rank's result is bit-identical (not defined for
    /// reduce-scatter, whose results are different shards).
    pub identical: Option<bool>,
    /// QUIC packets received per caller wake-up (per collective), rank 0.
    pub rx_pkts_per_wakeup: f64,
    /// Times the poll loop slept in poll(2), per collective, rank 0.
    pub idle_sleeps_per_op: f64,
    /// UDP payload bytes sent per collective, rank 0.
    pub wire_bytes_per_op: f64,
    /// Largest UDP payload per datagram (QUIC's packet size), rank 0.
    pub datagram_bytes: usize,
    /// Lanes this size ran on (see `--lanes`).
    pub lanes: usize,
    /// UDP payload bytes each lane sent per collective, rank 0.
    pub lane_wire_bytes_per_op: Vec<f64>,
    /// The CPU each of rank 0's lanes runs on (null: not pinned).
    pub lane_cpus: Vec<Option<usize>>,
    /// Where the collectives ran: "caller" or "thread" (`--progress`).
    pub progress: &'static str,
    /// Simulated computation per iteration, included in time_us.
    pub overlap_us: u64,
    /// How long the poll loop spun without traffic before sleeping.
    pub spin_us: u64,
}

/// Runs the mode: spawns local ranks, or is one rank.
pub fn run(args: &PerfArgs) -> Result<()> {
    validate(args)?;
    if let Some(n) = args.local_ranks {
        if !local::is_child() {
            return spawn_local(args, n as usize);
        }
    }
    // Before anything pins this thread: the spin default counts the CPUs
    // this process may use.
    let mut config = driver_config(args);
    config.quic = cluster_identity(args, config.quic)?;
    // Before anything pins this thread: threads started later inherit its
    // CPU, and the launcher's choice is read from this thread's affinity.
    let cpus = lane_cpus(args)?;
    match args.transport {
        Transport::Udp => {
            if local::is_child() {
                local::pin_child();
            } else if let Some(id) = cpus[0] {
                if !core_affinity::set_for_current(core_affinity::CoreId { id }) {
                    tracing::warn!("could not pin lane 0 to CPU {id}; running unpinned");
                }
            }
            run_rank(Lanes::from_env(config, args.lanes as usize, &cpus)?, args)
        }
        Transport::Dpdk => {
            let (lanes, _eal) = open_dpdk_lanes(args, &cpus)?;
            run_rank(Lanes::from_env_with(lanes, config, &cpus)?, args)
        }
    }
}

/// The CPU of each lane's thread (lane 0 is the caller's). With
/// `--local-ranks`, the launcher's choice; else the k-th CPU of
/// `--lcores`, which names one per lane. Without `--lcores`, kernel-UDP
/// lanes run unpinned, and DPDK lanes take the first CPUs the process
/// may run on: EAL
/// pins lane 0's thread, and unpinned lanes would inherit its CPU.
fn lane_cpus(args: &PerfArgs) -> Result<Vec<Option<usize>>> {
    let lanes = args.lanes as usize;
    if local::is_child() {
        return Ok(local::lane_cpus(lanes));
    }
    let Some(list) = &args.lcores else {
        return Ok(match args.transport {
            Transport::Udp => vec![None; lanes],
            Transport::Dpdk => {
                let online = crate::cpulist::usable_cpus()?;
                (0..lanes)
                    .map(|k| Some(online[k % online.len()] as usize))
                    .collect()
            }
        });
    };
    let cpus = crate::cpulist::parse_in_order(list)
        .map_err(|e| Error::Usage(format!("--lcores {list:?}: {e}")))?;
    if cpus.len() != lanes {
        return Err(Error::Usage(format!(
            "--lcores {list:?} names {} CPU(s) for {lanes} lane(s): give one per lane (lane k runs on the k-th)",
            cpus.len()
        )));
    }
    crate::cpulist::check_online(&cpus)?;
    Ok(cpus.into_iter().map(|c| Some(c as usize)).collect())
}

fn spawn_local(args: &PerfArgs, n: usize) -> Result<()> {
    let grace = Duration::from_secs_f64(args.timeout) + Duration::from_secs(10);
    // Before the virtual network exists: a signal while it is built ends
    // the run through its cleanup, not with the links left behind.
    let interrupted = crate::perf::udp::stop_flag(0.0)?;
    match args.transport {
        Transport::Udp => {
            // Every rank on this host would bind it: all but one fail.
            let bind = collectives::driver::rendezvous::bind_from_env()?;
            if let Some(b) = bind.filter(|b| b.port() != 0 && n > 1) {
                return Err(Error::Usage(format!(
                    "AINFTP_BIND={b} names a port, which only one of --local-ranks {n} ranks can bind: give port 0 ({}:0) and each rank takes a free one",
                    b.ip()
                )));
            }
            local::spawn_ranks(n, args.lanes as usize, grace, &interrupted, |_| Vec::new())
        }
        Transport::Dpdk => {
            // net_af_xdp cannot take an arena pool; net_af_packet copies
            // each frame into whatever pool it is given.
            let pmd = match args.mbuf_arena {
                true => vnet::Pmd::AfPacket,
                false => vnet::Pmd::AfXdp,
            };
            let net = vnet::VirtualNet::create(n, args.lanes as usize, pmd, args.mtu)?;
            let cpus = crate::cpulist::usable_cpus()?;
            local::spawn_ranks(n, args.lanes as usize, grace, &interrupted, |r| {
                net.rank_args(r, cpus[r % cpus.len()])
            })
        }
    }
}

/// UDP port of a rank on our stack, unless `AINFTP_BIND` names one.
const DPDK_RANK_PORT: u16 = 29_600;

/// This rank's lanes on our stack: lane k on the k-th port of `--pci`
/// then `--vdev`, with the k-th `--ip`, driven from the communicator's
/// calls. EAL runs on lane 0's CPU only (the caller's thread); the lanes
/// pin the others to `cpus`. (The EAL and the arena of `--mbuf-arena` are
/// kept while the stacks run.)
#[allow(clippy::type_complexity)]
fn open_dpdk_lanes(
    args: &PerfArgs,
    cpus: &[Option<usize>],
) -> Result<(
    Vec<(stack::runtime::InlineStack, SocketAddrV4)>,
    (dpdk_ffi::Eal, Vec<crate::arena_pool::ArenaPool>),
)> {
    let lanes = args.lanes as usize;
    let ports = quic::dpdk_ports(args, lanes)?;
    // A local rank's lcore comes from the launcher's `--lcores`.
    let main = match (local::is_child(), cpus[0]) {
        (false, Some(cpu)) => cpu as u32,
        _ => quic::dpdk_lcores(args)?[0],
    };
    let eal = quic::dpdk_eal(args, &[main])?;
    let udp_port =
        collectives::driver::rendezvous::bind_from_env()?.map_or(DPDK_RANK_PORT, |a| a.port());
    let mut stacks = Vec::with_capacity(lanes);
    let mut arenas = Vec::new();
    for port in &ports {
        let (rt, arena) = quic::port_runtime(&eal, args, port)?;
        arenas.extend(arena);
        let stack = rt
            .into_inline(udp_port)
            .map_err(|e| Error::Usage(e.to_string()))?;
        stacks.push((stack, SocketAddrV4::new(port.ip, udp_port)));
    }
    Ok((stacks, (eal, arenas)))
}

fn run_rank<B: LaneBackend>(mut lanes: Lanes<B>, args: &PerfArgs) -> Result<()>
where
    B::Buf: Send,
{
    lanes.set_min_lane_bytes(usize::try_from(args.lane_min_bytes).unwrap_or(usize::MAX));
    let (rank, world) = (lanes.rank(), lanes.world());
    if args.fault_exit_rank == Some(rank) {
        crate::eline!("ainftp-perf: rank {rank} exits on purpose (--fault-exit-rank)");
        std::process::exit(70);
    }
    if rank == 0 && !args.json {
        print_header(args, world, lanes.peers()[0], lanes.max_payload());
    }
    let mut comm = match args.progress {
        CollProgress::Caller => drive::RankDriver::Caller(lanes),
        CollProgress::Thread => {
            // Lane 0's CPU: the progress thread takes over lane 0's work.
            let cpu = lanes.cpus()[0];
            drive::RankDriver::Thread(collectives::driver::Background::spawn(lanes, cpu)?)
        }
    };
    let mut bytes = args.minbytes;
    let (mut wrong, mut differing_rows) = (0, 0);
    while bytes <= args.maxbytes {
        let row = measure(&mut comm, args, bytes)?;
        wrong += row.wrong;
        differing_rows += u64::from(row.identical == Some(false));
        if rank == 0 {
            if args.json {
                crate::oline!("{}", serde_json::to_string(&row).expect("row serialises"));
            } else {
                print_row(&row);
            }
        }
        bytes = match bytes.checked_mul(args.stepfactor) {
            Some(b) => b,
            None => break,
        };
    }
    comm.shutdown()?;
    // Every rank knows the total: all of them fail, as nccl-tests does.
    if wrong > 0 {
        return Err(Error::WrongResults(wrong));
    }
    if differing_rows > 0 {
        return Err(Error::RanksDiffer(differing_rows));
    }
    Ok(())
}

/// Bytes of memory a rank holds per byte of its largest size (peak RSS
/// over the size). f32: the input, the bucket, the copy that is checked,
/// and message buffers (measured: 3.1x at 256 MiB on one rank, 3.7x with
/// two). bf16 holds each of those but the bucket in f32, twice the bytes,
/// and the communicator's widened f32 copy besides (measured: 7.0x at 64
/// MiB on one rank, 8.4x with two; 10 leaves room for the allocator;
/// `tools/tests/perf_collectives.rs` checks it).
pub fn memory_per_byte(dtype: CollDtype) -> u64 {
    match dtype {
        CollDtype::F32 => 4,
        CollDtype::Bf16 => 10,
    }
}

/// Refuses sizes whose buffers cannot fit this machine's available
/// memory, with a message, rather than letting the allocator abort a rank.
fn check_memory(args: &PerfArgs) -> Result<()> {
    let ranks = args.local_ranks.unwrap_or(1) as u64;
    let per_byte = memory_per_byte(args.dtype);
    let need = args.maxbytes.saturating_mul(per_byte).saturating_mul(ranks);
    match mem_available() {
        Some(available) if need > available => Err(Error::Usage(format!(
            "-e {} needs about {} MiB for {ranks} rank(s) on this machine ({per_byte}x per rank with --dtype {}); {} MiB are available",
            args.maxbytes,
            need >> 20,
            match args.dtype {
                CollDtype::F32 => "f32",
                CollDtype::Bf16 => "bf16",
            },
            available >> 20
        ))),
        _ => Ok(()),
    }
}

/// `MemAvailable` of /proc/meminfo in bytes, where the kernel tells it.
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn validate(args: &PerfArgs) -> Result<()> {
    if args.local_ranks.is_some() && !local::is_child() {
        let dpdk = args.transport == Transport::Dpdk;
        let given = [
            (dpdk && !args.vdev.is_empty(), "--vdev"),
            (dpdk && !args.pci.is_empty(), "--pci"),
            (dpdk && !args.ip.is_empty(), "--ip"),
            (dpdk && !args.gateway.is_empty(), "--gateway"),
            (args.lcores.is_some(), "--lcores"),
        ];
        if let Some((_, flag)) = given.iter().find(|(set, _)| *set) {
            return Err(Error::Usage(match dpdk {
                true => format!("{flag} is chosen per rank with --local-ranks --transport dpdk (each rank gets af_xdp on its own veth)"),
                false => format!("{flag} is chosen per rank with --local-ranks (each rank and lane gets a CPU of its own)"),
            }));
        }
    }
    if args.lanes > 1 && args.mbuf_arena {
        return Err(Error::Usage(
            "--mbuf-arena runs with one lane: a rank's arena holds one port's buffers".into(),
        ));
    }
    if !local::is_child() {
        check_memory(args)?;
        // Every local rank's files, before any starts.
        if let (Some(dir), Some(n)) = (&args.certs, args.local_ranks) {
            for rank in 0..n as usize {
                rank_files(dir, rank)?;
            }
        }
    }
    if args.minbytes > args.maxbytes {
        return Err(Error::Usage(format!(
            "-b {} is larger than -e {}",
            args.minbytes, args.maxbytes
        )));
    }
    if args.connect_timeout == Some(0.0) {
        return Err(Error::Usage(
            "--connect-timeout 0: ranks need time to join; give seconds".into(),
        ));
    }
    if args.timeout <= 0.0 {
        return Err(Error::Usage(format!(
            "--timeout {}: a peer must be given more than 0 seconds",
            args.timeout
        )));
    }
    if args.clip.is_some() && args.codec != CollCodec::I16 {
        return Err(Error::Usage(
            "--clip applies to --codec i16 (f32 payloads carry no shared scale to protect)".into(),
        ));
    }
    Ok(())
}

/// `--certs DIR`: rank R's node files in DIR (`rankR.pem`, `rankR.key`,
/// `ca.pem`), mutual TLS with every peer.
fn cluster_identity(args: &PerfArgs, base: QuicConfig) -> Result<QuicConfig> {
    let Some(dir) = &args.certs else {
        return Ok(base);
    };
    let rank = RankEnv::from_env()?.rank;
    let files = rank_files(dir, rank)?;
    let cluster = QuicConfig::cluster_node(&files);
    Ok(QuicConfig {
        cert_chain: cluster.cert_chain,
        private_key: cluster.private_key,
        trust: cluster.trust,
        ..base
    })
}

/// Rank `rank`'s node files in `dir`, or which one is missing.
fn rank_files(dir: &std::path::Path, rank: usize) -> Result<NodeFiles> {
    let files = NodeFiles::in_dir(dir, &collectives::driver::mesh::node_name(rank));
    for f in [&files.ca, &files.cert, &files.key] {
        if !f.exists() {
            return Err(Error::Usage(format!(
                "--certs {}: no {} for rank {rank} (make them: ainftp-dp certs --dir {} --ca --node rank0 --node rank1 ...)",
                dir.display(),
                f.file_name().unwrap_or_default().to_string_lossy(),
                dir.display()
            )));
        }
    }
    Ok(files)
}

fn driver_config(args: &PerfArgs) -> DriverConfig {
    let engine = Config {
        codec: match args.codec {
            CollCodec::F32 => Codec::F32,
            CollCodec::I16 => Codec::I16(Rounding::Nearest),
        },
        algo: match args.algo {
            CollAlgo::Auto => Algo::Auto,
            CollAlgo::Ring => Algo::Ring,
            CollAlgo::Direct => Algo::Direct,
            CollAlgo::Rd => Algo::RecursiveDoubling,
        },
        clip: args.clip,
        ..Config::default()
    };
    let base = DriverConfig::default();
    DriverConfig {
        engine,
        conns_per_peer: args.conns_per_peer as usize,
        timeout: Duration::from_secs_f64(args.timeout),
        connect_timeout: args
            .connect_timeout
            .map_or(base.connect_timeout, Duration::from_secs_f64),
        spin: spin(args, base.spin),
        udp: KernelUdpConfig {
            max_payload: args
                .udp_payload
                .map_or(base.udp.max_payload, |p| p as usize),
            ..base.udp.clone()
        },
        follow_route_mtu: match args.udp_payload {
            Some(_) => None,
            None => base.follow_route_mtu,
        },
        quic: QuicConfig {
            congestion_control: args.cc.clone(),
            pacing: args.pacing,
            ..base.quic.clone()
        },
        ..base
    }
}

/// `--spin-us`, or the default for this run (see `default_spin`) given
/// the library's own. Read before a rank pins itself: the CPUs counted
/// are this thread's.
fn spin(args: &PerfArgs, library: Duration) -> Duration {
    if let Some(us) = args.spin_us {
        return Duration::from_micros(us);
    }
    let cpus = core_affinity::get_core_ids().map_or(1, |c| c.len().max(1));
    let threads = args
        .local_ranks
        .map(|n| usize::from(n) * usize::from(args.lanes));
    default_spin(threads, cpus, library)
}

/// Spinning helps while every polling thread has a CPU of its own; with
/// more local ranks x lanes (`threads`) than `cpus`, a spinning rank takes
/// the CPU a peer needs. 4 ranks on 2 CPUs, 8 B - 4 KiB all-reduces: over
/// kernel UDP 140-216 us spinning 50 us, 110-146 us without; on our DPDK
/// stack 165-282 and 105-183 us. 2 ranks: 22-28 us spinning, 31 without.
fn default_spin(threads: Option<usize>, cpus: usize, library: Duration) -> Duration {
    match threads {
        Some(t) if t > cpus => Duration::ZERO,
        _ => library,
    }
}

fn reduce_op(op: CollOp) -> ReduceOp {
    match op {
        CollOp::Sum => ReduceOp::Sum,
        CollOp::Avg => ReduceOp::Avg,
        CollOp::Max => ReduceOp::Max,
        CollOp::Min => ReduceOp::Min,
    }
}

fn collective(args: &PerfArgs) -> Collective {
    match args.mode {
        Mode::ReduceScatter => Collective::reduce_scatter(reduce_op(args.op)),
        Mode::Allgather => Collective::all_gather(),
        Mode::Broadcast => Collective::broadcast(0),
        _ => Collective::all_reduce(reduce_op(args.op)),
    }
}

/// nccl-tests' bus bandwidth factor for the mode.
fn bus_factor(mode: Mode, world: usize) -> f64 {
    let n = world as f64;
    match mode {
        Mode::Allreduce => 2.0 * (n - 1.0) / n,
        Mode::ReduceScatter | Mode::Allgather => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// What a row reports of the lanes themselves, read where they run.
struct LaneFacts {
    rank: usize,
    world: usize,
    counters: DriverCounters,
    lane_sent: Vec<u64>,
    algo: Result<&'static str>,
    lanes_for: usize,
    max_payload: usize,
    cpus: Vec<Option<usize>>,
    spin: Duration,
}

fn lane_facts<B: LaneBackend>(
    comm: &drive::RankDriver<B>,
    op: Op,
    count: usize,
) -> Result<LaneFacts>
where
    B::Buf: Send,
{
    comm.inspect(move |l| LaneFacts {
        rank: l.rank(),
        world: l.world(),
        counters: l.counters(),
        lane_sent: (0..l.lanes())
            .map(|k| l.lane(k).counters().wire.bytes_sent)
            .collect(),
        algo: algo_name(l, op, count),
        lanes_for: l.lanes_for(op, count),
        max_payload: l.max_payload(),
        cpus: l.cpus().to_vec(),
        spin: l.lane(0).config().spin,
    })
}

fn measure<B: LaneBackend>(
    comm: &mut drive::RankDriver<B>,
    args: &PerfArgs,
    bytes: u64,
) -> Result<Row>
where
    B::Buf: Send,
{
    // Whole elements, as nccl-tests does: the row reports what moved.
    let count = (bytes / check::elem_bytes(args.dtype)) as usize;
    let bytes = count as u64 * check::elem_bytes(args.dtype);
    let coll = collective(args);
    let facts = lane_facts(comm, coll.op, count)?;
    let (rank, world) = (facts.rank, facts.world);
    let mut input = vec![0f32; count];
    check::fill(args.mode, rank, world, &mut input);
    let mut buf = match args.dtype {
        CollDtype::F32 => drive::Bucket::F32(vec![0.0; count]),
        CollDtype::Bf16 => drive::Bucket::Bf16(vec![collectives::bf16::ZERO; count]),
    };
    for _ in 0..args.warmup_iters {
        buf.fill_from(&input);
        comm.step(coll, &mut buf, Duration::ZERO)?;
    }
    let before = lane_facts(comm, coll.op, count)?;
    let compute = Duration::from_micros(args.overlap_us);
    let mut total = Duration::ZERO;
    for _ in 0..args.iters {
        // Fresh input each time (not timed), so results stay checkable.
        buf.fill_from(&input);
        let t = Instant::now();
        comm.step(coll, &mut buf, compute)?;
        total += t.elapsed();
    }
    let after = lane_facts(comm, coll.op, count)?;
    let (before, lanes_before) = (before.counters, before.lane_sent);
    let (after, lanes_after) = (after.counters, after.lane_sent);
    let mut buf = buf.to_f32();
    if args.fault_corrupt_rank == Some(rank) {
        if let Some(i) = check::result_range(args.mode, rank, world, count).next() {
            buf[i] += 1.0;
        }
    }
    let (max_rel_err, wrong) = check::check(args, rank, world, &buf);
    let (max_rel_err, wrong) = agree_on_check(comm, max_rel_err, wrong)?;
    let identical = if args.mode == Mode::ReduceScatter {
        None
    } else {
        let range = check::result_range(args.mode, rank, world, count);
        Some(all_identical(comm, check::hash(&buf[range]))?)
    };
    let secs = total.as_secs_f64() / args.iters as f64;
    let algbw = (args.overlap_us == 0).then(|| bytes as f64 / secs / 1e9);
    let iters = args.iters as f64;
    let delta = |f: fn(&DriverCounters) -> u64| (f(&after) - f(&before)) as f64;
    Ok(Row {
        mode: args.mode.name(),
        ranks: world,
        bytes,
        count,
        ty: match args.dtype {
            CollDtype::F32 => "float",
            CollDtype::Bf16 => "bfloat16",
        },
        codec: match args.codec {
            CollCodec::F32 => "f32",
            CollCodec::I16 => "i16",
        },
        // An all-gather or a broadcast reduces nothing (and takes no --op).
        op: if matches!(args.mode, Mode::Broadcast | Mode::Allgather) {
            "none"
        } else {
            match args.op {
                CollOp::Sum => "sum",
                CollOp::Avg => "avg",
                CollOp::Max => "max",
                CollOp::Min => "min",
            }
        },
        algo: facts.algo?,
        datagram_bytes: facts.max_payload,
        lanes: facts.lanes_for,
        lane_wire_bytes_per_op: lanes_before
            .iter()
            .zip(&lanes_after)
            .map(|(b, a)| (a - b) as f64 / args.iters as f64)
            .collect(),
        lane_cpus: facts.cpus,
        progress: match args.progress {
            CollProgress::Caller => "caller",
            CollProgress::Thread => "thread",
        },
        overlap_us: args.overlap_us,
        spin_us: facts.spin.as_micros() as u64,
        time_us: secs * 1e6,
        algbw,
        busbw: algbw.map(|bw| bw * bus_factor(args.mode, world)),
        max_rel_err,
        wrong,
        identical,
        rx_pkts_per_wakeup: delta(|c| c.wire.packets_received) / delta(|c| c.wakeups).max(1.0),
        idle_sleeps_per_op: delta(|c| c.idle_waits) / iters,
        wire_bytes_per_op: delta(|c| c.wire.bytes_sent) / iters,
    })
}

fn algo_name<B: LaneBackend>(comm: &Lanes<B>, op: Op, count: usize) -> Result<&'static str>
where
    B::Buf: Send,
{
    Ok(match comm.algo_for(op, count)? {
        collectives::AlgoId::Ring => "ring",
        collectives::AlgoId::Direct => "direct",
        collectives::AlgoId::RecursiveDoubling => "rd",
    })
}

/// Every rank's check, as one verdict: wrong elements summed over the
/// ranks (exactly: in base-4096 digits, each digit's sum fits an f32) and
/// the largest relative error any rank saw.
fn agree_on_check<B: LaneBackend>(
    comm: &mut drive::RankDriver<B>,
    max_rel_err: f64,
    wrong: u64,
) -> Result<(f64, u64)>
where
    B::Buf: Send,
{
    const DIGIT: u64 = 4096;
    let digits: Vec<f32> = (0..6)
        .map(|k| ((wrong / DIGIT.pow(k)) % DIGIT) as f32)
        .collect();
    let total = all_reduce_small(comm, digits, ReduceOp::Sum)?
        .iter()
        .enumerate()
        .map(|(k, &d)| d as u64 * DIGIT.pow(k as u32))
        .sum();
    let err = all_reduce_small(comm, vec![max_rel_err as f32], ReduceOp::Max)?;
    let worst = f64::from(err[0]).max(max_rel_err);
    Ok((worst, total))
}

/// Whether every rank's hash equals ours. Each of the 64 bits and its
/// complement go through one all-reduce(max): a bit differs somewhere iff
/// both it and its complement reach 1.
fn all_identical<B: LaneBackend>(comm: &mut drive::RankDriver<B>, hash: u64) -> Result<bool>
where
    B::Buf: Send,
{
    let mut bits = vec![0f32; 128];
    for k in 0..64 {
        let b = ((hash >> k) & 1) as f32;
        bits[k] = b;
        bits[64 + k] = 1.0 - b;
    }
    let bits = all_reduce_small(comm, bits, ReduceOp::Max)?;
    Ok((0..64).all(|k| !(bits[k] > 0.5 && bits[64 + k] > 0.5)))
}

/// An all-reduce of a few f32 values through the ranks' own driver (the
/// checks' bookkeeping, not timed), exact whatever `--codec` and `--clip`
/// say: the verdict must not be quantized or clipped itself.
fn all_reduce_small<B: LaneBackend>(
    comm: &mut drive::RankDriver<B>,
    values: Vec<f32>,
    op: ReduceOp,
) -> Result<Vec<f32>>
where
    B::Buf: Send,
{
    let mut bucket = drive::Bucket::F32(values);
    let exact = Collective::all_reduce(op).with_codec(Codec::F32);
    comm.step(exact, &mut bucket, Duration::ZERO)?;
    Ok(bucket.to_f32())
}

fn print_header(args: &PerfArgs, world: usize, me: SocketAddrV4, payload: usize) {
    let transport = match args.transport {
        Transport::Udp => "kernel UDP".to_string(),
        Transport::Dpdk => format!("our DPDK stack ({me})"),
    };
    let transport = format!("{transport}, {payload} B datagrams");
    crate::oline!(
        "# ainftp-perf {}: {world} ranks, QUIC over {transport}, {} lane(s)/rank, {} conn/peer, {} warmup + {} timed iterations",
        args.mode.name(),
        args.lanes,
        args.conns_per_peer,
        args.warmup_iters,
        args.iters
    );
    let progress = match args.progress {
        CollProgress::Caller => "in the caller's thread",
        CollProgress::Thread => "on a progress thread per rank",
    };
    if args.overlap_us > 0 {
        crate::oline!(
            "# collectives run {progress}; each timed iteration also computes {} us (time_us is the whole step)",
            args.overlap_us
        );
    } else if args.progress == CollProgress::Thread {
        crate::oline!("# collectives run {progress}");
    }
    crate::oline!(
        "# {:>12} {:>10} {:>8} {:>5} {:>4} {:>6} {:>11} {:>10} {:>10} {:>11} {:>6} {:>9} {:>10}",
        "size",
        "count",
        "type",
        "codec",
        "op",
        "algo",
        "time_us",
        "algbw_GBs",
        "busbw_GBs",
        "max_rel_err",
        "wrong",
        "identical",
        "pkts/wake"
    );
}

fn print_row(r: &Row) {
    let identical = match r.identical {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "-",
    };
    let bw = |b: Option<f64>| b.map_or("-".to_string(), |b| format!("{b:.4}"));
    crate::oline!(
        "  {:>12} {:>10} {:>8} {:>5} {:>4} {:>6} {:>11.1} {:>10} {:>10} {:>11.2e} {:>6} {:>9} {:>10.1}",
        r.bytes,
        r.count,
        r.ty,
        r.codec,
        r.op,
        r.algo,
        r.time_us,
        bw(r.algbw),
        bw(r.busbw),
        r.max_rel_err,
        r.wrong,
        identical,
        r.rx_pkts_per_wakeup
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::default_spin;

    #[test]
    fn ranks_spin_only_while_each_has_a_cpu() {
        let fifty = Duration::from_micros(50);
        assert_eq!(default_spin(Some(4), 2, fifty), Duration::ZERO);
        assert_eq!(default_spin(Some(2), 2, fifty), fifty);
        assert_eq!(default_spin(Some(3), 16, fifty), fifty);
        // A rank of a job launched elsewhere: no local count to compare.
        assert_eq!(default_spin(None, 1, fifty), fifty);
    }
}
