//! The communicator: an [`Engine`] over a [`Mesh`], blocking and
//! non-blocking collectives, liveness, counters.
//!
//! The poll loop runs in the caller's thread, inside the calls: blocking
//! collectives and `wait` loop until done; `test` runs one round and
//! returns. Nothing moves while the caller is away, so overlap needs
//! `test` calls (or a thread of the caller's owning the communicator).
//! The loop spins for `DriverConfig::spin` without traffic, then sleeps in
//! `poll(2)` until a datagram or a QUIC timer is due.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use stack::io::kernel::KernelUdp;
use tracing::debug;

use super::backend::{Backend, WireCounters};
use super::goodbye::Goodbye;
use super::mesh::{ConnectWait, Mesh};
use super::rendezvous::{self, RankEnv};
use super::watch::Watch;
use super::DriverConfig;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::{bf16, Collective, Counters, Progress, ReduceOp};

/// Everything the communicator counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverCounters {
    /// UDP datagrams and payload bytes, each way (QUIC packets).
    pub wire: WireCounters,
    pub frames_sent: u64,
    pub frames_received: u64,
    /// Flushes where QUIC took less than was queued (backpressure).
    pub send_blocked: u64,
    /// Accepted connections refused before they said which rank they are.
    pub connections_refused: u64,
    /// Handshakes QUIC turned away for lack of room (see
    /// `MeshCounters::handshakes_dropped`).
    pub handshakes_dropped: u64,
    /// Times a peer's next frame was left in its stream until this rank
    /// caught up (see `MeshCounters::frames_held_back`).
    pub frames_held_back: u64,
    /// Times the caller got control back with a finished collective (one
    /// per collective: a blocking call's return, or `wait`).
    pub wakeups: u64,
    /// Times the loop slept in `poll(2)` for lack of traffic.
    pub idle_waits: u64,
    /// The engine's own counters (messages, early arrivals, completions).
    pub engine: Counters,
}

/// A non-blocking collective started with [`Communicator::start`].
#[derive(Debug, PartialEq, Eq, Hash)]
#[must_use = "wait for the operation to get its buffer back"]
pub struct OpHandle(u64);

struct Queued {
    id: u64,
    collective: Collective,
    buf: Vec<f32>,
    started: bool,
}

/// Per-collective loop state: idle spinning and liveness checks.
struct Clock {
    idle_since: Option<Instant>,
    next_ping: Instant,
    next_watch: Instant,
}

impl Clock {
    fn new(timeout: Duration) -> Clock {
        let now = Instant::now();
        Clock {
            idle_since: None,
            next_ping: now + timeout / 4,
            next_watch: now,
        }
    }

    /// A new collective: idle and ping times start over; the links keep
    /// their pace (reading them at every start would cost rank 0 a read
    /// per rank per collective).
    fn restart(&mut self, timeout: Duration) {
        self.idle_since = None;
        self.next_ping = Instant::now() + timeout / 4;
    }
}

/// How often the liveness links are read during a collective (idle
/// waits end in time for it): a relay reaches a rank within twice this
/// of rank 0 seeing the link close.
const WATCH_EVERY: Duration = Duration::from_millis(10);
/// How long a rank found dead (its liveness link closed) may stay so
/// before the running collective fails. A rank that completed this
/// collective and then exited without dropping its communicator has sent
/// all of its part: the others finish from what is in flight well within
/// this; one that did not is needed, and nothing completes without it.
const LOST_GRACE: Duration = Duration::from_millis(200);

impl DriverCounters {
    /// Adds `o` field by field (the lanes of one rank).
    pub fn add(&mut self, o: &DriverCounters) {
        let w = &mut self.wire;
        w.packets_sent += o.wire.packets_sent;
        w.bytes_sent += o.wire.bytes_sent;
        w.packets_received += o.wire.packets_received;
        w.bytes_received += o.wire.bytes_received;
        self.frames_sent += o.frames_sent;
        self.frames_received += o.frames_received;
        self.send_blocked += o.send_blocked;
        self.connections_refused += o.connections_refused;
        self.handshakes_dropped += o.handshakes_dropped;
        self.frames_held_back += o.frames_held_back;
        self.wakeups += o.wakeups;
        self.idle_waits += o.idle_waits;
        let e = &mut self.engine;
        e.bytes_sent += o.engine.bytes_sent;
        e.messages_sent += o.engine.messages_sent;
        e.bytes_received += o.engine.bytes_received;
        e.messages_received += o.engine.messages_received;
        e.wakeups += o.engine.wakeups;
        e.early_buffered += o.engine.early_buffered;
    }
}

/// Longest idle wait of a blocking call: traffic wakes it sooner; this
/// bounds how late a ping or a timeout is noticed.
const LONGEST_NAP: Duration = Duration::from_millis(100);

/// Collectives over QUIC between `world` ranks. See the module docs for
/// where the loop runs.
pub struct Communicator<B: Backend = KernelUdp> {
    rank: usize,
    world: usize,
    cfg: DriverConfig,
    engine: Engine,
    mesh: Mesh<B>,
    queue: VecDeque<Queued>,
    done: HashMap<u64, Result<Vec<f32>>>,
    next_id: u64,
    failed: Option<Error>,
    wakeups: u64,
    idle_waits: u64,
    clock: Clock,
    /// The liveness links of a job joined through the rendezvous; `Drop`
    /// says `bye` on them after the QUIC goodbyes.
    watch: Option<Watch>,
    /// bf16 buckets widened to f32 (grows to the largest bucket).
    wide: Vec<f32>,
}

impl Communicator<KernelUdp> {
    /// Binds `peers[rank]` (kernel UDP) and connects to every other rank
    /// at its address in `peers`.
    pub fn new(
        rank: usize,
        world: usize,
        peers: Vec<SocketAddrV4>,
        config: DriverConfig,
    ) -> Result<Self> {
        config.validate()?;
        let bind = *peers
            .get(rank)
            .ok_or(Error::RankOutOfRange { rank, world })?;
        let io = bind_udp(bind, &config)?;
        Communicator::with_backend(rank, world, io, peers, config)
    }

    /// The torchrun way: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
    /// `MASTER_PORT` from the environment; binds `AINFTP_BIND` (default
    /// `0.0.0.0:0`), swaps addresses through rank 0's TCP rendezvous, then
    /// connects.
    pub fn from_env(config: DriverConfig) -> Result<Self> {
        // A bad environment fails before anything is bound.
        let env = RankEnv::from_env()?;
        let bind = rendezvous::bind_from_env()?.unwrap_or(rendezvous::wildcard(0));
        Communicator::from_env_bound(&env, bind, config)
    }

    /// `from_env` with the job's environment given and the socket bound
    /// to `bind`.
    pub fn from_env_bound(env: &RankEnv, bind: SocketAddrV4, config: DriverConfig) -> Result<Self> {
        let (io, config) = Communicator::bind_for(env, bind, config)?;
        let advertise = io.local_addr();
        Communicator::from_env_with_at(env, io, advertise, config)
    }

    /// The socket `from_env_bound` binds, and `config` with datagrams
    /// sized by the route MTU to the master when it asks for that.
    pub(crate) fn bind_for(
        env: &RankEnv,
        bind: SocketAddrV4,
        mut config: DriverConfig,
    ) -> Result<(KernelUdp, DriverConfig)> {
        config.validate()?;
        if let Some(cap) = config.follow_route_mtu {
            let master = env.master_by(Instant::now() + config.connect_timeout)?;
            config.udp.max_payload = stack::io::kernel::route_payload(master, cap)
                .map_err(|e| Error::Transport(format!("route MTU to {master}: {e}")))?;
            tracing::debug!(%master, payload = config.udp.max_payload, "datagrams sized by the route MTU");
        }
        Ok((bind_udp(bind, &config)?, config))
    }
}

fn bind_udp(addr: SocketAddrV4, config: &DriverConfig) -> Result<KernelUdp> {
    KernelUdp::bind(addr, config.udp.clone()).map_err(|e| Error::Transport(e.to_string()))
}

impl<B: Backend> Communicator<B> {
    /// The torchrun way over an already open backend: `RANK`,
    /// `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` from the environment;
    /// `advertise` (where the others reach `io`) is swapped through rank
    /// 0's TCP rendezvous, then the mesh connects.
    pub fn from_env_with(io: B, advertise: SocketAddrV4, config: DriverConfig) -> Result<Self> {
        Communicator::from_env_with_at(&RankEnv::from_env()?, io, advertise, config)
    }

    /// `from_env_with` with the job's environment given.
    pub fn from_env_with_at(
        env: &RankEnv,
        io: B,
        advertise: SocketAddrV4,
        config: DriverConfig,
    ) -> Result<Self> {
        config.validate()?;
        let start = Instant::now();
        let (peers, watch) = rendezvous::exchange(env, advertise, config.connect_timeout)?;
        let left = config.connect_left(start);
        let mut watch = watch;
        Communicator::with_backend_within(
            env.rank,
            env.world,
            io,
            peers,
            config,
            left,
            Some(&mut watch),
        )
        .map(|c| c.watched(watch))
        .map_err(|e| DriverConfig::join_error(start, e))
    }

    /// Connects over an already open backend (`peers[rank]` is this rank's
    /// own address, as the others see it).
    pub fn with_backend(
        rank: usize,
        world: usize,
        io: B,
        peers: Vec<SocketAddrV4>,
        config: DriverConfig,
    ) -> Result<Self> {
        let limit = config.connect_timeout;
        Communicator::with_backend_within(rank, world, io, peers, config, limit, None)
    }

    /// `with_backend`, giving up on the connections after `limit` (what is
    /// left of `connect_timeout` after the rendezvous).
    pub(crate) fn with_backend_within(
        rank: usize,
        world: usize,
        io: B,
        peers: Vec<SocketAddrV4>,
        config: DriverConfig,
        limit: Duration,
        watch: Option<&mut Watch>,
    ) -> Result<Self> {
        let mut engine = Engine::new(rank, world, config.engine.clone())?;
        let wait = ConnectWait { limit, watch };
        let mesh = Mesh::connect(rank, world, io, peers, &config, wait, &mut engine)?;
        let clock = Clock::new(config.timeout);
        Ok(Communicator {
            rank,
            world,
            cfg: config,
            engine,
            mesh,
            queue: VecDeque::new(),
            done: HashMap::new(),
            next_id: 0,
            failed: None,
            wakeups: 0,
            idle_waits: 0,
            clock,
            watch: None,
            wide: Vec::new(),
        })
    }

    /// Reads `watch`, the job's liveness links, while collectives run.
    pub(crate) fn watched(mut self, watch: Watch) -> Self {
        self.watch = Some(watch);
        self
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// Every rank's QUIC address, by rank.
    pub fn peers(&self) -> &[SocketAddrV4] {
        self.mesh.peers()
    }

    /// Where this rank's connections to `rank` send now: its listed
    /// address, or the one it came from (a NAT may have moved it since).
    pub fn peer_addr(&self, rank: usize) -> SocketAddrV4 {
        self.mesh.addr_of(rank)
    }

    /// Bytes of UDP payload per datagram on the wire.
    pub fn max_payload(&self) -> usize {
        self.mesh.max_payload()
    }

    pub fn config(&self) -> &DriverConfig {
        &self.cfg
    }

    /// Message bytes this rank sent to `rank` on each of its connections
    /// (`DriverConfig::conns_per_peer` of them, striped).
    pub fn bytes_per_connection(&self, rank: usize) -> Vec<u64> {
        self.mesh.bytes_per_connection(rank)
    }

    /// Forgets a tensor's error-feedback residual (`Engine::clear_residual`):
    /// when the tensor's length changes, or it is gone. Every rank must do
    /// the same. Refused with `Busy` while collectives are started and not
    /// waited for (a queued one would run after the clear it preceded).
    pub fn clear_residual(&mut self, tensor: u64) -> Result<()> {
        if !self.queue.is_empty() {
            return Err(Error::Busy);
        }
        self.engine.clear_residual(tensor)
    }

    /// The algorithm the engine runs for `op` over `count` elements.
    pub fn algo_for(&self, op: crate::Op, count: usize) -> Result<crate::AlgoId> {
        self.engine.algo_for(op, count)
    }

    /// Why this communicator cannot run collectives any more, once a
    /// collective failed (see [`Error::Failed`]).
    pub fn failure(&self) -> Option<&Error> {
        self.failed.as_ref()
    }

    pub fn counters(&self) -> DriverCounters {
        let m = self.mesh.counters();
        DriverCounters {
            wire: self.mesh.wire(),
            frames_sent: m.frames_sent,
            frames_received: m.frames_received,
            send_blocked: m.send_blocked,
            connections_refused: m.connections_refused,
            handshakes_dropped: m.handshakes_dropped,
            frames_held_back: m.frames_held_back,
            wakeups: self.wakeups,
            idle_waits: self.idle_waits,
            engine: self.engine.counters(),
        }
    }

    pub fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        self.run(Collective::all_reduce(op), buf)
    }

    /// The result is this rank's shard `shard_range(len, world, rank)`.
    pub fn reduce_scatter(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        self.run(Collective::reduce_scatter(op), buf)
    }

    /// This rank's shard of `buf` in, all of `buf` out.
    pub fn all_gather(&mut self, buf: &mut [f32]) -> Result<()> {
        self.run(Collective::all_gather(), buf)
    }

    pub fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()> {
        self.run(Collective::broadcast(root), buf)
    }

    pub fn barrier(&mut self) -> Result<()> {
        self.run(Collective::barrier(), &mut [])
    }

    /// `all_reduce` on bf16: reduced in f32, rounded to bf16 once (see
    /// [`crate::dtype`]).
    pub fn all_reduce_bf16(&mut self, buf: &mut [bf16], op: ReduceOp) -> Result<()> {
        self.run_bf16(Collective::all_reduce(op), buf)
    }

    /// `run` on a bf16 buffer, widened to f32 for the collective.
    pub fn run_bf16(&mut self, collective: Collective, buf: &mut [bf16]) -> Result<()> {
        let mut wide = std::mem::take(&mut self.wide);
        let r = crate::dtype::through_f32(buf, &mut wide, |x| self.run(collective, x));
        self.wide = wide;
        r
    }

    /// Runs `collective` on `buf` to completion (after any started
    /// non-blocking ones, which complete first, in order).
    pub fn run(&mut self, collective: Collective, buf: &mut [f32]) -> Result<()> {
        self.run_alongside(collective, buf, LONGEST_NAP, || Ok(()))
    }

    /// `run` for a caller that must keep other traffic moving meanwhile
    /// (the other lanes of [`super::Lanes`]): `between` is called after
    /// every round, and an idle wait lasts at most `max_nap`. An error
    /// from `between` fails this communicator too (it is mid-collective).
    pub(crate) fn run_alongside(
        &mut self,
        collective: Collective,
        buf: &mut [f32],
        max_nap: Duration,
        mut between: impl FnMut() -> Result<()>,
    ) -> Result<()> {
        self.usable()?;
        while let Some(id) = self.queue.back().map(|q| q.id) {
            self.drive_until(|c| c.done.contains_key(&id))?;
        }
        let seq = self.engine.seq();
        self.check_departed(seq, Instant::now(), |_| true)
            .map_err(|e| self.fail(e))?;
        let first = match self.engine.start(collective, buf) {
            Ok(p) => p,
            // Refused outright (a bad buffer, say): still usable.
            Err(e) if !self.engine.is_active() => return Err(e),
            // Failed half-way in: out of step with the peers.
            Err(e) => return Err(self.fail(e)),
        };
        self.mesh.reset_liveness();
        self.clock.restart(self.cfg.timeout);
        let mut complete = first == Progress::Complete;
        let mut flush_until = None;
        while !(complete && self.quiet()) {
            let mut now_done = false;
            let r = self.round(buf, &mut now_done, Some(max_nap));
            complete |= now_done;
            if let Err(e) = r {
                return Err(self.fail(e));
            }
            between().map_err(|e| self.fail(e))?;
            // Done here; our last sends may wait on a slow peer's flow
            // control. Bounded: they also leave with the next call (and
            // `round` fails them for a peer that left without them).
            if complete {
                let until = *flush_until.get_or_insert_with(|| Instant::now() + self.cfg.timeout);
                if Instant::now() > until {
                    break;
                }
            }
        }
        self.wakeups += 1;
        Ok(())
    }

    /// Starts a non-blocking collective on `buf` (owned until `wait`).
    /// Collectives run in the order started.
    pub fn start(&mut self, collective: Collective, buf: Vec<f32>) -> Result<OpHandle> {
        self.usable()?;
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(Queued {
            id,
            collective,
            buf,
            started: false,
        });
        self.step(None)?;
        Ok(OpHandle(id))
    }

    /// One round of progress without sleeping; whether `h` is done.
    pub fn test(&mut self, h: &OpHandle) -> Result<bool> {
        if !self.done.contains_key(&h.0) {
            self.step(None)?;
        }
        Ok(self.done.contains_key(&h.0))
    }

    /// One round of traffic, whether or not a collective is running: our
    /// pending sends, retransmissions and acknowledgements move, and
    /// peers' messages for the next collective are buffered. Then waits up
    /// to `max_wait` for a datagram or a QUIC timer (zero: returns at once).
    pub fn progress(&mut self, max_wait: Duration) -> Result<()> {
        self.step(None)?;
        if !max_wait.is_zero() {
            let r = self.mesh.idle_wait(max_wait);
            r.map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    /// Drives until `h` is done; returns its buffer (the result).
    pub fn wait(&mut self, h: OpHandle) -> Result<Vec<f32>> {
        if !self.done.contains_key(&h.0) && !self.queue.iter().any(|q| q.id == h.0) {
            return Err(Error::UnknownHandle(h.0));
        }
        let id = h.0;
        self.drive_until(|c| c.done.contains_key(&id))?;
        let result = self.done.remove(&id).expect("checked");
        // Our last messages leave before the caller goes away (bounded:
        // they also leave with the next call). A failure meanwhile is the
        // next call's to report: this result is whole, and the handle is
        // spent, so it must not be lost.
        if self.queue.is_empty() {
            let until = Instant::now() + self.cfg.timeout;
            let _ = self.drive_until(|c| c.quiet() || Instant::now() > until);
        }
        self.wakeups += 1;
        result
    }

    /// Leaves the mesh cleanly: our last data goes out, and every peer
    /// finishes too (up to `timeout`), so nobody is cut off mid-collective.
    /// Dropping does the same but cannot report.
    pub fn shutdown(mut self) -> Result<()> {
        self.usable()?;
        if self.engine.is_active() || !self.queue.is_empty() {
            // Peers cannot finish what we abandon: leave at once (Drop
            // closes without lingering) and say so.
            return Err(self.fail(Error::Transport(format!(
                "shut down with {} collective(s) not waited for",
                self.queue.len().max(1)
            ))));
        }
        // A rank known gone from its liveness link has nothing to finish.
        self.read_watch(Instant::now());
        let bye = Goodbye::new(self.engine.completed_seq(), None);
        let unfinished = self.mesh.close(&mut self.engine, self.cfg.timeout, bye);
        if let Some(mut w) = self.watch.take() {
            w.say_bye(bye);
        }
        self.failed = Some(Error::Transport("shut down".into()));
        match unfinished.first() {
            None => Ok(()),
            Some(&rank) => Err(Error::PeerUnfinished {
                rank,
                addr: self.mesh.addr_of(rank).to_string(),
                waited_ms: self.cfg.timeout.as_millis() as u64,
                completed: self.engine.completed_seq(),
            }),
        }
    }

    fn usable(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(Error::Failed(Box::new(e.clone()))),
            None => Ok(()),
        }
    }

    /// Every message of ours has left the driver.
    fn quiet(&self) -> bool {
        self.engine.pending_sends() == 0 && self.mesh.is_flushed()
    }

    fn drive_until(&mut self, mut done: impl FnMut(&Self) -> bool) -> Result<()> {
        while !done(self) {
            self.step(Some(LONGEST_NAP))?;
        }
        Ok(())
    }

    /// One round for the non-blocking queue: start its head if needed,
    /// move traffic, retire it when complete.
    fn step(&mut self, nap: Option<Duration>) -> Result<()> {
        self.usable()?;
        let Some(head) = self.queue.front_mut() else {
            // Nothing queued: still move traffic (flushes, acks).
            let r = self.round(&mut [], &mut false, nap);
            return r.map_err(|e| self.fail(e));
        };
        if !head.started {
            head.started = true;
            if let Err(e) = self.check_departed(self.engine.seq(), Instant::now(), |_| true) {
                let e = self.fail(e);
                self.retire(Err(e));
                return Ok(());
            }
            let head = self.queue.front_mut().expect("head");
            match self.engine.start(head.collective, &mut head.buf) {
                Ok(Progress::Complete) => {
                    self.retire(Ok(()));
                    return Ok(());
                }
                Ok(Progress::Pending) => {
                    self.mesh.reset_liveness();
                    self.clock.restart(self.cfg.timeout);
                }
                Err(e) => {
                    let e = match self.engine.is_active() {
                        true => self.fail(e),
                        false => e,
                    };
                    self.retire(Err(e));
                    return Ok(());
                }
            }
        }
        let mut buf = std::mem::take(&mut self.queue.front_mut().expect("head").buf);
        let mut complete = false;
        let r = self.round(&mut buf, &mut complete, nap);
        self.queue.front_mut().expect("head").buf = buf;
        match r {
            Ok(()) if complete => self.retire(Ok(())),
            Ok(()) => {}
            Err(e) => {
                let e = self.fail(e);
                self.retire(Err(e.clone()));
                return Err(e);
            }
        }
        Ok(())
    }

    fn retire(&mut self, result: Result<()>) {
        let q = self.queue.pop_front().expect("head");
        self.done.insert(q.id, result.map(|()| q.buf));
    }

    /// One turn of the mesh, then idling (with `nap`: a wait of at most
    /// that long once idle for `spin`) and liveness.
    fn round(&mut self, buf: &mut [f32], complete: &mut bool, nap: Option<Duration>) -> Result<()> {
        let work = self.mesh.turn(&mut self.engine, buf, complete)?;
        let now = Instant::now();
        if now >= self.clock.next_watch {
            self.read_watch(now);
            self.clock.next_watch = now + WATCH_EVERY;
        }
        if work > 0 || *complete {
            self.clock.idle_since = None;
        } else {
            let since = *self.clock.idle_since.get_or_insert(now);
            if let Some(nap) = nap.filter(|_| now - since >= self.cfg.spin) {
                // Pings are due only while a collective runs (they are
                // sent, and rescheduled, only then).
                let mut until = nap;
                if self.engine.is_active() {
                    until = until.min(self.clock.next_ping.saturating_duration_since(now));
                }
                if self.watch.is_some() {
                    until = until.min(self.clock.next_watch.saturating_duration_since(now));
                }
                self.mesh.idle_wait(until)?;
                self.idle_waits += 1;
            }
        }
        if self.engine.is_active() {
            self.check_departed(self.engine.seq(), now, |_| true)?;
            self.check_liveness(now)?;
        } else if !self.mesh.is_flushed() {
            // A completed collective's sends wait to leave: a peer that
            // left without completing it (a broadcast root's receiver that
            // failed) will never take those queued for it, and waiting
            // them out took the whole timeout, call after call.
            let last = self.engine.seq().wrapping_sub(1);
            self.check_departed(last, now, |r| self.mesh.sends_waiting_for(r))?;
        }
        Ok(())
    }

    /// Reads the liveness links (rank 0 relays what it hears), and hands
    /// the goodbyes they carried to the mesh.
    fn read_watch(&mut self, now: Instant) {
        let Some(w) = self.watch.as_mut() else {
            return;
        };
        w.poll();
        for (rank, bye) in w.take_departed() {
            if rank != self.rank {
                self.mesh.note_departed_by_link(rank, bye, now);
            }
        }
    }

    /// A peer that said goodbye before completing collective `seq` (the
    /// running one, or one about to start or just completed here) will
    /// never send, or take, the rest of it; one whose liveness link (or,
    /// without the rendezvous's links, its UDP port) closed without a
    /// goodbye crashed.
    fn check_departed(
        &self,
        seq: u32,
        now: Instant,
        concerned: impl Fn(usize) -> bool,
    ) -> Result<()> {
        let said_goodbye = |r: usize| self.mesh.has_departed(r);
        // A liveness link says whether a rank's process lives; a closed
        // UDP port says less: a NAT that moved a live rank to a new port
        // leaves the old one closed, and the rank may compute for long
        // before it speaks again from the new one.
        if self.watch.is_none() {
            if let Some(rank) = self
                .mesh
                .gone(now)
                .find(|&r| !said_goodbye(r) && concerned(r))
            {
                return Err(Error::PeerGone {
                    rank,
                    addr: self.mesh.addr_of(rank).to_string(),
                    seq,
                });
            }
        }
        let mut lost = self
            .watch
            .iter()
            .flat_map(|w| w.lost_for(LOST_GRACE, now))
            .filter(|&r| r != self.rank);
        if let Some(rank) = lost.find(|&r| !said_goodbye(r) && concerned(r)) {
            return Err(Error::PeerLost {
                rank,
                addr: self.mesh.addr_of(rank).to_string(),
                seq,
            });
        }
        // `seq` at or after the first collective the peer did not complete
        // (sequence numbers wrap).
        let missed = |completed: u32| seq.wrapping_sub(completed) < 1 << 31;
        // One that completed it may still have left before all it sent of
        // it arrived (closing after a failure of its own drops what QUIC
        // had not sent yet): once nothing more can come from it, waiting
        // for the rest is in vain.
        let cut_off = |rank: usize| self.engine.owes(rank) && self.mesh.nothing_more_from(rank);
        match self
            .mesh
            .departed()
            .iter()
            .find(|&&(rank, bye)| concerned(rank) && (missed(bye.completed) || cut_off(rank)))
        {
            Some(&(rank, bye)) => Err(Error::PeerLeft {
                rank,
                addr: self.mesh.addr_of(rank).to_string(),
                completed: bye.completed,
                seq,
                failed: bye.failed,
                cause: bye.cause,
            }),
            None => Ok(()),
        }
    }

    /// Pings every peer each quarter timeout; a peer silent for a whole
    /// timeout fails the collective (QUIC acknowledges pings, so live
    /// peers are never silent that long while they run the loop), and so
    /// does one to which what we send has been lost, not acknowledged,
    /// for that long though it is heard (a path that drops our packets:
    /// nothing else would ever end the wait), and so does a collective in
    /// which no message moved for that long though every rank is heard.
    fn check_liveness(&mut self, now: Instant) -> Result<()> {
        if now < self.clock.next_ping {
            return Ok(());
        }
        self.clock.next_ping = now + self.cfg.timeout / 4;
        self.mesh.ping_all();
        let (me, mesh) = (self.rank, &self.mesh);
        let peers = || (0..self.world).filter(move |&r| r != me);
        let seq = self.engine.seq();
        let timeout = self.cfg.timeout;
        let silent = longest_overdue(peers(), |r| Some(mesh.last_heard(r)), now, timeout);
        if let Some((rank, waited)) = silent {
            return Err(Error::PeerTimeout {
                rank,
                addr: self.mesh.addr_of(rank).to_string(),
                waited_ms: waited.as_millis() as u64,
                seq,
            });
        }
        let stalled = longest_overdue(peers(), |r| mesh.stalled_since(r), now, timeout);
        if let Some((rank, waited)) = stalled {
            return Err(Error::PeerStalled {
                rank,
                addr: self.mesh.addr_of(rank).to_string(),
                waited_ms: waited.as_millis() as u64,
                seq,
            });
        }
        // Every rank answers, and yet nothing of the collective moves: a
        // rank whose progress thread runs has not entered it.
        let idle = self.mesh.without_progress(now);
        if idle >= timeout {
            let owed = self.engine.owed();
            return Err(Error::NoProgress {
                seq,
                waited_ms: idle.as_millis() as u64,
                waiting_on: owed.iter().map(|o| o.rank).collect(),
                not_entered: owed
                    .iter()
                    .filter(|o| o.not_entered())
                    .map(|o| o.rank)
                    .collect(),
            });
        }
        Ok(())
    }

    /// Abandons the running collective; the communicator is unusable
    /// afterwards (peers are out of step or gone).
    fn fail(&mut self, e: Error) -> Error {
        if self.failed.is_none() {
            debug!(rank = self.rank, error = %e, "collective failed");
            self.engine.abort();
            self.failed = Some(e.clone());
        }
        e
    }
}

/// Of `peers`, the one whose `since` lies longest before `now`, if that is
/// `timeout` or more ago.
fn longest_overdue(
    peers: impl Iterator<Item = usize>,
    since: impl Fn(usize) -> Option<Instant>,
    now: Instant,
    timeout: Duration,
) -> Option<(usize, Duration)> {
    peers
        .filter_map(|r| Some((r, now.saturating_duration_since(since(r)?))))
        .max_by_key(|&(_, d)| d)
        .filter(|&(_, d)| d >= timeout)
}

impl<B: Backend> Drop for Communicator<B> {
    fn drop(&mut self) {
        // Dropped mid-collective: peers cannot finish it either.
        if self.engine.is_active() || !self.queue.is_empty() {
            self.engine.abort();
            self.failed
                .get_or_insert(Error::Transport("dropped mid-collective".into()));
        }
        // After a failure peers are gone or out of step: close at once.
        let linger = if self.failed.is_some() {
            Duration::ZERO
        } else {
            self.cfg.timeout
        };
        let bye = Goodbye::new(self.engine.completed_seq(), self.failed.as_ref());
        let _ = self.mesh.close(&mut self.engine, linger, bye);
        // After the QUIC goodbyes: the liveness links learn this was no
        // crash, and carry the goodbye to every rank through rank 0 in
        // case the QUIC close was lost.
        if let Some(w) = &mut self.watch {
            w.say_bye(bye);
        }
    }
}
