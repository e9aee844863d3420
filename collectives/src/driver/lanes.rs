//! One bucket over several lanes: a [`Communicator`] per lane (its own
//! socket or port, QUIC connections, engine), each run by its own thread
//! pinned to its own CPU, share-nothing.
//!
//! A QUIC connection is one congestion window and one core's worth of
//! crypto and copies; lanes multiply both. A large bucket is cut into one
//! part per lane for as many lanes as get `min_lane_bytes` each, when
//! that makes at least [`MIN_SPLIT_PARTS`] parts or uses every lane
//! (every rank cuts the same way, from the length alone); those lanes run
//! their parts at once, lane 0 on the caller's thread, the others keep
//! their traffic moving, and the caller is woken once, when the last lane
//! is done. An all-reduce or broadcast is cut into contiguous parts; a
//! reduce-scatter or all-gather, whose result is laid out by rank, gives
//! each lane a piece of every rank's shard, gathered into a buffer of the
//! lane's own ([`super::lane_layout`]). Smaller buckets and barriers run
//! on lane 0 while the caller's thread keeps the other lanes' traffic
//! moving: a peer may still need a retransmission from a lane whose part
//! finished here, and it joins the next collective only after it got it.
//!
//! Every rank must open the same number of lanes with the same
//! `min_lane_bytes`.

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use stack::io::kernel::KernelUdp;

use super::communicator::{Communicator, DriverCounters};
use super::lane_layout::{split_by_lane, GatheredPart};
use super::{rendezvous, Backend, DriverConfig, RankEnv};
use crate::algo::shard_range;
use crate::error::{Error, Result};
use crate::{Collective, Op, ReduceOp};

/// Below this many bytes per lane a bucket is not split. Measured on a
/// 16-core host (2 and 4 ranks over kernel UDP): parts of 256 KiB made a
/// 1 MiB all-reduce 1.6x slower than one lane (a lane's thread start and
/// its connections' ramp-up cost more than the part), parts of 1 MiB made
/// an 8 MiB one 1.8x faster.
pub const DEFAULT_MIN_LANE_BYTES: usize = 1 << 20;

/// Several communicators that split each large bucket between them.
pub struct Lanes<B: Backend + Send = KernelUdp>
where
    B::Buf: Send,
{
    lanes: Vec<Communicator<B>>,
    /// CPU each lane's thread is pinned to (None: not pinned). Lane 0 runs
    /// on the caller's thread, which is left where it is.
    cpus: Vec<Option<usize>>,
    min_lane_bytes: usize,
    wakeups: u64,
    /// Why the lanes are out of step with their peers, once they are.
    failed: Option<Error>,
    /// bf16 buckets widened to f32 (grows to the largest bucket).
    wide: Vec<f32>,
    /// Each lane's gathered pieces of a split reduce-scatter or
    /// all-gather (grows to the largest part).
    gathered: Vec<Vec<f32>>,
}

impl Lanes<KernelUdp> {
    /// The torchrun way with `lanes` lanes: lane k binds its own UDP
    /// socket (`AINFTP_BIND`'s address with port + k when set, else an
    /// ephemeral port), then the lanes connect as in
    /// [`Lanes::from_env_with`]. Lane k (k >= 1) is pinned to `cpus[k]`
    /// when given.
    pub fn from_env(
        mut config: DriverConfig,
        lanes: usize,
        cpus: &[Option<usize>],
    ) -> Result<Self> {
        if lanes == 0 {
            return Err(Error::Config("lanes must be at least 1"));
        }
        config.validate()?;
        let env = RankEnv::from_env()?;
        let bind = rendezvous::bind_from_env()?;
        let mut ios = Vec::with_capacity(lanes);
        for k in 0..lanes {
            let addr = match bind {
                Some(b) if b.port() != 0 => {
                    let port = b.port().checked_add(k as u16).ok_or(Error::Env {
                        var: "AINFTP_BIND",
                        problem: format!("port {} + lane {k} is beyond 65535", b.port()),
                    })?;
                    SocketAddrV4::new(*b.ip(), port)
                }
                Some(b) => b,
                None => rendezvous::wildcard(0),
            };
            let (io, sized) = Communicator::<KernelUdp>::bind_for(&env, addr, config)?;
            config = sized;
            let advertise = io.local_addr();
            ios.push((io, advertise));
        }
        let comms = connect_lanes(&env, ios, &config)?;
        Ok(Lanes::new(comms, cpus.to_vec(), DEFAULT_MIN_LANE_BYTES))
    }
}

/// Swaps every lane's address through its own rendezvous on
/// `MASTER_PORT + k` (TCP, lane by lane, in the same order on every
/// rank), then connects all lanes at once, each on its own thread: a lane
/// waiting for a peer's lost handshake packet never stops another lane
/// from answering the handshake that peer is waiting in.
fn connect_lanes<B: Backend + Send>(
    env: &RankEnv,
    ios: Vec<(B, SocketAddrV4)>,
    config: &DriverConfig,
) -> Result<Vec<Communicator<B>>>
where
    B::Buf: Send,
{
    config.validate()?;
    // One budget for every lane's rendezvous and connections together.
    let start = Instant::now();
    let lanes = ios.len();
    let mut meshes = Vec::with_capacity(lanes);
    for (k, (io, advertise)) in ios.into_iter().enumerate() {
        let left = config.connect_left(start);
        let (peers, watch) = rendezvous::exchange(&env.lane(k, lanes)?, advertise, left)?;
        meshes.push((io, peers, watch));
    }
    let left = config.connect_left(start);
    let connect = |(io, peers, mut watch)| {
        let c = config.clone();
        Communicator::with_backend_within(env.rank, env.world, io, peers, c, left, Some(&mut watch))
            .map(|c| c.watched(watch))
            .map_err(|e| DriverConfig::join_error(start, e))
    };
    if meshes.len() == 1 {
        return Ok(vec![connect(meshes.pop().expect("one lane"))?]);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = meshes
            .into_iter()
            .map(|mesh| s.spawn(move || connect(mesh)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Transport(
                        "a lane's thread panicked while connecting".into(),
                    ))
                })
            })
            .collect()
    })
}

impl<B: Backend + Send> Lanes<B>
where
    B::Buf: Send,
{
    /// The torchrun way over backends already open, one per lane (e.g. a
    /// DPDK port each): lane k swaps `ios[k]`'s advertised address through
    /// its own rendezvous on `MASTER_PORT + k` (lane by lane, in the same
    /// order on every rank), then all lanes connect at once, each on its
    /// own thread. Lane k (k >= 1) is pinned to `cpus[k]` when given.
    pub fn from_env_with(
        ios: Vec<(B, SocketAddrV4)>,
        config: DriverConfig,
        cpus: &[Option<usize>],
    ) -> Result<Self> {
        Lanes::connect(&RankEnv::from_env()?, ios, config, cpus)
    }

    /// `from_env_with` with the job's environment given.
    pub fn connect(
        env: &RankEnv,
        ios: Vec<(B, SocketAddrV4)>,
        config: DriverConfig,
        cpus: &[Option<usize>],
    ) -> Result<Self> {
        if ios.is_empty() {
            return Err(Error::Config("lanes must be at least 1"));
        }
        let comms = connect_lanes(env, ios, &config)?;
        Ok(Lanes::new(comms, cpus.to_vec(), DEFAULT_MIN_LANE_BYTES))
    }

    /// Lanes from connected communicators (lane k is `comms[k]`; every
    /// rank must pass its lanes in the same order).
    pub fn new(
        comms: Vec<Communicator<B>>,
        cpus: Vec<Option<usize>>,
        min_lane_bytes: usize,
    ) -> Self {
        assert!(!comms.is_empty(), "Lanes needs at least one communicator");
        Lanes {
            gathered: comms.iter().map(|_| Vec::new()).collect(),
            lanes: comms,
            cpus,
            min_lane_bytes: min_lane_bytes.max(1),
            wakeups: 0,
            failed: None,
            wide: Vec::new(),
        }
    }

    /// Split a bucket into parts of at least `bytes` from now on, one per
    /// lane, as many as fit, when that is at least [`MIN_SPLIT_PARTS`]
    /// (or every lane, when there are fewer); else it runs on one lane.
    /// With 8 lanes and 1 MiB, a 4 MiB bucket goes to 4 lanes. Every rank
    /// must use the same value.
    pub fn set_min_lane_bytes(&mut self, bytes: usize) {
        self.min_lane_bytes = bytes.max(1);
    }

    /// The CPU each lane's thread is pinned to (None: not pinned; lane 0
    /// is the caller's thread, left where it is).
    pub fn cpus(&self) -> &[Option<usize>] {
        &self.cpus
    }

    pub fn rank(&self) -> usize {
        self.lanes[0].rank()
    }

    pub fn world(&self) -> usize {
        self.lanes[0].world()
    }

    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Lane 0's peer addresses (rank order).
    pub fn peers(&self) -> &[SocketAddrV4] {
        self.lanes[0].peers()
    }

    /// Largest UDP payload of lane 0's datagrams.
    pub fn max_payload(&self) -> usize {
        self.lanes[0].max_payload()
    }

    /// The algorithm lane 0 (and, for a split bucket, every lane on its
    /// part) runs for `op` over `count` elements.
    pub fn algo_for(&self, op: Op, count: usize) -> Result<crate::AlgoId> {
        let lanes = self.lanes_for(op, count);
        self.lanes[0].algo_for(op, count.div_ceil(lanes))
    }

    /// Lane `k`'s communicator (its counters, its peers).
    pub fn lane(&self, k: usize) -> &Communicator<B> {
        &self.lanes[k]
    }

    /// How many lanes a collective of `count` elements runs on: as many
    /// as get at least `min_lane_bytes` of it, when that is at least
    /// [`MIN_SPLIT_PARTS`] (or every lane, if there are fewer); else one.
    pub fn lanes_for(&self, op: Op, count: usize) -> usize {
        let splits = !matches!(op, Op::Barrier);
        let lanes = self.lanes.len();
        let fit = (count.saturating_mul(4) / self.min_lane_bytes).min(lanes);
        if splits && fit >= 2 && fit >= MIN_SPLIT_PARTS.min(lanes) {
            fit
        } else {
            1
        }
    }

    /// All lanes' counters added up, except `wakeups`: one per collective
    /// returned to the caller, however many lanes ran it.
    pub fn counters(&self) -> DriverCounters {
        let mut total = DriverCounters::default();
        for c in &self.lanes {
            total.add(&c.counters());
        }
        total.wakeups = self.wakeups;
        total
    }

    /// One round of traffic on every lane without waiting (see
    /// [`Communicator::progress`]); the first lane's error, after all
    /// lanes had their round.
    pub fn progress(&mut self) -> Result<()> {
        let mut first_error = Ok(());
        for lane in &mut self.lanes {
            let r = lane.progress(Duration::ZERO);
            if first_error.is_ok() {
                first_error = r;
            }
        }
        first_error
    }

    pub fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        self.run(Collective::all_reduce(op), buf)
    }

    pub fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()> {
        self.run(Collective::new(Op::Broadcast { root }), buf)
    }

    /// `run` on a bf16 buffer, widened to f32 for the collective (see
    /// [`crate::dtype`]).
    pub fn run_bf16(&mut self, collective: Collective, buf: &mut [crate::bf16]) -> Result<()> {
        let mut wide = std::mem::take(&mut self.wide);
        let r = crate::dtype::through_f32(buf, &mut wide, |x| self.run(collective, x));
        self.wide = wide;
        r
    }

    /// Runs `collective` on `buf`, split over lanes when it is large
    /// enough (see [`Self::lanes_for`]).
    pub fn run(&mut self, collective: Collective, buf: &mut [f32]) -> Result<()> {
        if let Some(why) = &self.failed {
            return Err(Error::Failed(Box::new(why.clone())));
        }
        let split = match self.lanes.len() {
            1 => 1,
            _ => self.lanes_for(collective.op, buf.len()),
        };
        let (result, broken) = match split {
            1 if self.lanes.len() == 1 => (self.lanes[0].run(collective, buf), false),
            1 => (self.run_on_lane_zero(collective, buf), false),
            n => self.run_split(collective, buf, n),
        };
        match &result {
            Ok(()) => self.wakeups += 1,
            // A lane that failed is out of step with its peers, and so are
            // lanes whose thread did not start or panicked. A collective
            // the lanes' communicators refused (a bad root, say) leaves
            // every lane usable, as it leaves a communicator. The failed
            // lane's cause is kept as it was, so that `peer_at_fault`
            // still names the rank.
            Err(e) => {
                let lane_failure = self.lanes.iter().find_map(|l| l.failure().cloned());
                if lane_failure.is_some() || broken {
                    self.failed = Some(lane_failure.unwrap_or_else(|| e.clone()));
                }
            }
        }
        result
    }

    /// Lane 0 runs the collective in place while the other lanes' traffic
    /// keeps moving: they are polled every `OTHER_LANES_EVERY` at most
    /// (each poll is a receive call per lane), and lane 0 naps no longer
    /// than that when idle.
    fn run_on_lane_zero(&mut self, collective: Collective, buf: &mut [f32]) -> Result<()> {
        let (first, others) = self.lanes.split_first_mut().expect("at least one lane");
        let mut next_poll = Instant::now();
        first.run_alongside(collective, buf, OTHER_LANES_EVERY, || {
            let now = Instant::now();
            if now >= next_poll {
                for lane in others.iter_mut() {
                    lane.progress(Duration::ZERO)?;
                }
                next_poll = now + OTHER_LANES_EVERY;
            }
            Ok(())
        })
    }

    /// Lanes `0..n` run one part of `buf` each; the lanes beyond `n`
    /// only keep their traffic moving until those are done. Also says
    /// whether a lane's thread did not start or panicked.
    fn run_split(
        &mut self,
        collective: Collective,
        buf: &mut [f32],
        n: usize,
    ) -> (Result<()>, bool) {
        let (count, lanes, world) = (buf.len(), self.lanes.len(), self.world());
        let mut parts: Vec<Option<Part>> = Vec::with_capacity(lanes);
        if matches!(collective.op, Op::ReduceScatter(_) | Op::AllGather) {
            let pieces = split_by_lane(buf, world, n);
            for (pieces, own) in pieces.into_iter().zip(&mut self.gathered) {
                parts.push(Some(Part::Pieces(pieces, own)));
            }
        } else {
            let mut rest = buf;
            for k in 0..n {
                let (part, tail) = rest.split_at_mut(shard_range(count, n, k).len());
                parts.push(Some(Part::Contiguous(part)));
                rest = tail;
            }
        }
        parts.resize_with(lanes, || None);
        let mut parts = parts.into_iter();
        let first_part = parts.next().flatten().expect("lane 0 has a part");
        let (first_lane, others) = self.lanes.split_first_mut().expect("n >= 2");
        let cpus = &self.cpus;
        let running = AtomicUsize::new(n);
        let running = &running;
        std::thread::scope(|s| {
            let mut handles = Vec::with_capacity(lanes - 1);
            let mut not_started = None;
            for (i, (comm, part)) in others.iter_mut().zip(parts).enumerate() {
                let cpu = cpus.get(i + 1).copied().flatten();
                let lane = std::thread::Builder::new().spawn_scoped(s, move || {
                    if let Some(id) = cpu {
                        core_affinity::set_for_current(core_affinity::CoreId { id });
                    }
                    match part {
                        Some(part) => run_part(comm, collective, part, running),
                        None => keep_moving(comm, running),
                    }
                });
                match lane {
                    Ok(h) => handles.push(h),
                    Err(e) => {
                        if i + 1 < n {
                            // A lane with a part would never count itself done.
                            running.fetch_sub(1, Ordering::AcqRel);
                        }
                        not_started.get_or_insert(Error::Transport(format!(
                            "starting lane {}'s thread: {e}",
                            i + 1
                        )));
                    }
                }
            }
            // Lane 0 works on the caller's thread meanwhile.
            let result = run_part(first_lane, collective, first_part, running);
            let broken = not_started.is_some();
            let (result, panicked) = join_lanes(not_started.map_or(result, Err), handles);
            (result, broken || panicked)
        })
    }

    /// Leaves every lane cleanly (see [`Communicator::shutdown`]); the
    /// first lane's error is returned. Dropping does the same but cannot
    /// report.
    pub fn shutdown(mut self) -> Result<()> {
        leave_all(std::mem::take(&mut self.lanes))
    }
}

impl<B: Backend + Send> Drop for Lanes<B>
where
    B::Buf: Send,
{
    fn drop(&mut self) {
        let _ = leave_all(std::mem::take(&mut self.lanes));
    }
}

/// The fewest parts a bucket is split into when there are more lanes:
/// on the 16-core host (README), 2 MiB in two 1 MiB parts took longer
/// than on one lane (f32 3311 against 2812 us, 2 ranks x 8 lanes; 4 x 4
/// alike), while 4 MiB in four parts beat one lane (3643 against 5540).
pub const MIN_SPLIT_PARTS: usize = 4;

/// How often the other lanes move their traffic while lane 0 runs a
/// collective alone: often enough that a peer waiting on one of them for
/// a retransmission or an acknowledgement is not held up for long.
const OTHER_LANES_EVERY: Duration = Duration::from_micros(200);

/// How long a lane that finished its part (or has none) sleeps at most
/// between rounds while the rank's other lanes still work. The call
/// returns only once every lane's thread noticed the last part is done:
/// 1 ms here cost up to 1 ms per split bucket (an 8 MiB bucket on 2 ranks
/// x 8 lanes took 5327 us, against 3846 with 100 us).
const FINISHED_LANE_WAIT: Duration = Duration::from_micros(100);

/// One lane's share of a split bucket.
enum Part<'a> {
    /// A contiguous part of the bucket (all-reduce, broadcast).
    Contiguous(&'a mut [f32]),
    /// The lane's piece of every rank's shard, in rank order, and the
    /// lane's buffer to gather them in (reduce-scatter, all-gather).
    Pieces(Vec<&'a mut [f32]>, &'a mut Vec<f32>),
}

/// Runs one lane's part, then keeps the lane's traffic moving until every
/// lane of this rank is done: a peer's lane may still need our
/// retransmissions or unsent data, and our other lanes may be waiting for
/// that peer.
fn run_part<B: Backend>(
    comm: &mut Communicator<B>,
    collective: Collective,
    part: Part,
    running: &AtomicUsize,
) -> Result<()> {
    let result = {
        // Counted done also when `run` panics: the other lanes would
        // otherwise wait for this one for ever.
        let _done = CountDown(running);
        match part {
            Part::Contiguous(buf) => comm.run(collective, buf),
            Part::Pieces(pieces, own) => {
                // Gathered and scattered on the lane's own thread, so the
                // copies run in parallel too.
                let mut gathered = GatheredPart::gather(pieces, own);
                let result = comm.run(collective, gathered.buf());
                if result.is_ok() {
                    let all = matches!(collective.op, Op::AllGather);
                    gathered.scatter(comm.rank(), all);
                }
                result
            }
        }
    };
    result?;
    keep_moving(comm, running)
}

/// Keeps a lane's traffic moving, with no part of its own (left), until
/// every lane of this rank that has one is done.
fn keep_moving<B: Backend>(comm: &mut Communicator<B>, running: &AtomicUsize) -> Result<()> {
    while running.load(Ordering::Acquire) > 0 {
        comm.progress(FINISHED_LANE_WAIT)?;
    }
    Ok(())
}

/// Takes one off the count of running lanes when dropped.
struct CountDown<'a>(&'a AtomicUsize);

impl Drop for CountDown<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Shuts the lanes down all at once: each waits for its peers' lanes to
/// finish too, so one after another could wait on each other.
fn leave_all<B: Backend + Send>(lanes: Vec<Communicator<B>>) -> Result<()>
where
    B::Buf: Send,
{
    std::thread::scope(|s| {
        let handles: Vec<_> = lanes
            .into_iter()
            .map(|c| s.spawn(move || c.shutdown()))
            .collect();
        join_lanes(Ok(()), handles).0
    })
}

/// Waits for every lane's thread; the first error (`first`, then in lane
/// order) is the result, and whether a thread panicked.
fn join_lanes(
    first: Result<()>,
    handles: Vec<std::thread::ScopedJoinHandle<'_, Result<()>>>,
) -> (Result<()>, bool) {
    let (mut result, mut panicked) = (first, false);
    for h in handles {
        let lane = h.join().unwrap_or_else(|_| {
            panicked = true;
            Err(Error::Transport("a lane's thread panicked".into()))
        });
        if result.is_ok() {
            result = lane;
        }
    }
    (result, panicked)
}
