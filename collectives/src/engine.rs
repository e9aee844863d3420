//! The per-rank engine: validates incoming messages, buffers those of
//! future collectives, dispatches to the running algorithm and reports
//! completion once per collective.

use std::collections::VecDeque;

use crate::algo::broadcast::Broadcast;
use crate::algo::direct::Direct;
use crate::algo::rd::{Rd, RdGather};
use crate::algo::ring::Ring;
use crate::algo::{Algorithm, Ctx};
use crate::codec::feedback::Residuals;
use crate::codec::{Codec, Combine, Isa};
use crate::error::{Error, Result};
use crate::message::{self, AlgoId, Kind, MAX_I16_CHUNK};
use crate::{Algo, Collective, ContributionFilter, Counters, Op, Outgoing, Progress, ReduceOp};

/// Engine configuration. Every rank must use the same values (except
/// `isa`), or messages are rejected as unexpected.
#[derive(Debug, Clone)]
pub struct Config {
    /// Elements per chunk (1..=65535); the pipelining and i16 scale unit.
    pub chunk_elems: usize,
    pub codec: Codec,
    pub algo: Algo,
    /// `Algo::Auto` uses recursive doubling at or below this many bytes.
    pub small_bytes: usize,
    /// Honest per-element magnitude bound `C` of the i16 clip policy
    /// (crate docs); `None` trusts every peer.
    pub clip: Option<f32>,
    /// Base seed of stochastic rounding.
    pub seed: u64,
    /// Most bytes of future-collective messages held (past it `handle`
    /// errs; a driver asks `takes_now` and waits instead).
    pub max_early_bytes: usize,
    /// How many collectives ahead a peer's message may be (as above;
    /// below 2^31, since sequence numbers wrap).
    pub max_ahead: u32,
    /// Force an instruction set (tests); `None` picks the best.
    pub isa: Option<Isa>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            chunk_elems: 16 * 1024,
            codec: Codec::F32,
            algo: Algo::Auto,
            small_bytes: 64 * 1024,
            clip: None,
            seed: 0x5EED,
            max_early_bytes: 256 << 20,
            max_ahead: 64,
            isa: None,
        }
    }
}

/// A peer from which the running collective still needs messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owed {
    pub rank: usize,
    /// Messages of the collective taken from it so far.
    pub received: usize,
    /// Messages of the collective this rank takes from it in all.
    pub expected: usize,
    /// Of those, how many it sends as soon as it enters the collective:
    /// with `received` 0 and this above 0, it has not entered it (or its
    /// messages are lost on the way).
    pub on_entry: usize,
}

impl Owed {
    /// It owes messages it would have sent on entering the collective.
    pub fn not_entered(&self) -> bool {
        self.received == 0 && self.on_entry > 0
    }
}

struct Active {
    seq: u32,
    kind: Kind,
    algo: AlgoId,
    count: usize,
    barrier: bool,
    tensor: Option<u64>,
}

/// One rank's collectives engine (sans-IO). See the crate docs for the
/// driver contract.
pub struct Engine {
    ctx: Ctx,
    config: Config,
    next_seq: u32,
    /// The sequence number after the last collective that completed here
    /// (an aborted one does not count).
    completed_seq: u32,
    active: Option<Active>,
    /// Per peer: messages of the running collective taken from it.
    received_from: Vec<usize>,
    early: VecDeque<(usize, u32, Vec<u8>)>,
    early_bytes: usize,
    residuals: Residuals,
    barrier_cell: [f32; 1],
    ring: Ring,
    direct: Direct,
    rd: Rd,
    rd_gather: RdGather,
    broadcast: Broadcast,
}

impl Engine {
    pub fn new(rank: usize, world: usize, config: Config) -> Result<Engine> {
        if world == 0 || rank >= world {
            return Err(Error::RankOutOfRange { rank, world });
        }
        if config.chunk_elems == 0 || config.chunk_elems > MAX_I16_CHUNK {
            return Err(Error::Config("chunk_elems must be in 1..=65535"));
        }
        if config.clip.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
            return Err(Error::Config("clip must be finite and > 0"));
        }
        // Sequence numbers wrap: a message more than half the space ahead
        // is one behind, and must be refused as stale, not kept as early.
        if config.max_ahead >= 1 << 31 {
            return Err(Error::Config("max_ahead must be below 2^31"));
        }
        let ctx = Ctx {
            rank,
            world,
            chunk_elems: config.chunk_elems,
            isa: config.isa.unwrap_or_else(Isa::best),
            seed: config.seed,
            clip: config.clip.unwrap_or(f32::INFINITY),
            outbox: VecDeque::new(),
            pool: Vec::new(),
            pool_bytes: 0,
            counters: Counters::default(),
            filter: None,
            staging: Vec::new(),
            seq: 0,
            kind: Kind::Barrier,
            algo: AlgoId::Ring,
            codec: config.codec,
            combine: Combine::Sum,
            avg: false,
            residual: None,
        };
        Ok(Engine {
            ctx,
            config,
            next_seq: 0,
            completed_seq: 0,
            active: None,
            received_from: vec![0; world],
            early: VecDeque::new(),
            early_bytes: 0,
            residuals: Residuals::default(),
            barrier_cell: [0.0],
            ring: Ring::default(),
            direct: Direct::default(),
            rd: Rd::default(),
            rd_gather: RdGather::default(),
            broadcast: Broadcast::default(),
        })
    }

    pub fn rank(&self) -> usize {
        self.ctx.rank
    }

    pub fn world(&self) -> usize {
        self.ctx.world
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Installs the robust-aggregation hook (reductions then run Direct).
    /// Refused with `Busy` while a collective runs: a Direct reduction
    /// part folded without the hook would wait for ever for the rest.
    pub fn set_filter(&mut self, filter: Box<dyn ContributionFilter + Send>) -> Result<()> {
        if self.is_active() {
            return Err(Error::Busy);
        }
        self.ctx.filter = Some(filter);
        Ok(())
    }

    pub fn counters(&self) -> Counters {
        self.ctx.counters
    }

    /// Whether a collective is running.
    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// Sequence number of the running collective, or of the next one.
    pub fn seq(&self) -> u32 {
        self.active.as_ref().map_or(self.next_seq, |a| a.seq)
    }

    /// The sequence number after the last collective that completed here
    /// (an aborted one does not count): with at most one abort, the last
    /// thing a failed rank does, the number of collectives it completed.
    pub fn completed_seq(&self) -> u32 {
        self.completed_seq
    }

    /// The error-feedback residual of a tensor, if any.
    pub fn residual(&self, tensor: u64) -> Option<&[f32]> {
        self.residuals.get(tensor)
    }

    /// Forgets a tensor's error-feedback residual: when its length changes
    /// (a residual of another length is refused with `ResidualLength`), or
    /// when the tensor is gone, to free the memory. Every rank must do the
    /// same before the tensor's next collective. Refused with `Busy` while
    /// a collective runs (it holds the residual and puts it back).
    pub fn clear_residual(&mut self, tensor: u64) -> Result<()> {
        if self.is_active() {
            return Err(Error::Busy);
        }
        self.residuals.clear(tensor);
        Ok(())
    }

    /// The algorithm this engine runs for `op` over `count` elements: the
    /// explicit `Config::algo`, or the `Algo::Auto` rule (crate docs).
    pub fn algo_for(&self, op: Op, count: usize) -> Result<AlgoId> {
        let reduction = matches!(op, Op::AllReduce(_) | Op::ReduceScatter(_));
        let filtered = reduction && self.ctx.filter.is_some();
        let small = count.saturating_mul(4) <= self.config.small_bytes;
        let chosen = match self.config.algo {
            Algo::Ring => AlgoId::Ring,
            Algo::Direct => AlgoId::Direct,
            Algo::RecursiveDoubling => AlgoId::RecursiveDoubling,
            Algo::Auto => match op {
                Op::Barrier => AlgoId::RecursiveDoubling,
                _ if filtered => AlgoId::Direct,
                _ if small => AlgoId::RecursiveDoubling,
                _ => AlgoId::Ring,
            },
        };
        if filtered && chosen != AlgoId::Direct {
            let algo = match chosen {
                AlgoId::Ring => Algo::Ring,
                _ => Algo::RecursiveDoubling,
            };
            return Err(Error::FilterNeedsDirect(algo));
        }
        Ok(chosen)
    }

    /// Next message to hand to the transport.
    pub fn poll_send(&mut self) -> Option<Outgoing> {
        self.ctx.outbox.pop_front()
    }

    /// Number of queued outgoing messages.
    pub fn pending_sends(&self) -> usize {
        self.ctx.outbox.len()
    }

    /// Returns a sent message's buffer to the engine's pool (optional; it
    /// keeps the steady state allocation-free).
    pub fn recycle(&mut self, bytes: Vec<u8>) {
        self.ctx.recycle(bytes);
    }

    /// Starts the next collective on `buf` (see [`Op`] for the buffer
    /// convention; a barrier ignores it). An error with [`Self::is_active`]
    /// false refused it and changed nothing; with it true the collective
    /// failed once begun (an i16 input that is not finite, say), and the
    /// caller must [`Self::abort`] it.
    pub fn start(&mut self, collective: Collective, user_buf: &mut [f32]) -> Result<Progress> {
        if self.active.is_some() {
            return Err(Error::Busy);
        }
        let op = collective.op;
        let barrier = op == Op::Barrier;
        let count = if barrier { 1 } else { user_buf.len() };
        let (kind, reduce) = match op {
            Op::AllReduce(r) => (Kind::AllReduce, Some(r)),
            Op::ReduceScatter(r) => (Kind::ReduceScatter, Some(r)),
            Op::AllGather => (Kind::AllGather, None),
            Op::Broadcast { root } => {
                if root >= self.ctx.world {
                    return Err(Error::RankOutOfRange {
                        rank: root,
                        world: self.ctx.world,
                    });
                }
                (Kind::Broadcast, None)
            }
            Op::Barrier => (Kind::Barrier, Some(ReduceOp::Sum)),
        };
        let algo = self.algo_for(op, count)?;
        let seq = self.next_seq;
        let (n, r, ce) = (self.ctx.world, self.ctx.rank, self.ctx.chunk_elems);
        let ctx = &mut self.ctx;
        ctx.seq = seq;
        ctx.kind = kind;
        ctx.algo = algo;
        ctx.codec = if barrier {
            Codec::F32
        } else {
            collective.codec.unwrap_or(self.config.codec)
        };
        ctx.combine = match reduce {
            Some(ReduceOp::Max) => Combine::Max,
            Some(ReduceOp::Min) => Combine::Min,
            _ => Combine::Sum,
        };
        ctx.avg = reduce == Some(ReduceOp::Avg);
        let buf: &mut [f32] = if barrier {
            self.barrier_cell = [0.0];
            &mut self.barrier_cell
        } else {
            &mut *user_buf
        };
        // Error feedback and clipping apply to a rank's own contribution.
        let feedback = matches!(reduce, Some(ReduceOp::Sum | ReduceOp::Avg))
            && matches!(ctx.codec, Codec::I16(_))
            && !barrier;
        let tensor = collective.tensor.filter(|_| feedback && n > 1);
        if let Some(t) = tensor {
            let mut res = self.residuals.take(t, count)?;
            for (x, rv) in buf.iter_mut().zip(res.iter_mut()) {
                *x += *rv;
                *rv = 0.0;
            }
            ctx.residual = Some(res);
        }
        if matches!(ctx.codec, Codec::I16(_)) && ctx.clip.is_finite() && n > 1 {
            let c = ctx.clip;
            let own = match kind {
                Kind::AllGather => crate::shard_range(count, n, r),
                _ => 0..count,
            };
            for x in &mut buf[own] {
                *x = x.clamp(-c, c);
            }
        }
        let alg: &mut dyn Algorithm = match (kind, algo) {
            (Kind::Broadcast, shape) => {
                let Op::Broadcast { root } = op else {
                    unreachable!()
                };
                self.broadcast.reset(count, n, ce, r, root, shape);
                &mut self.broadcast
            }
            (Kind::AllGather, AlgoId::RecursiveDoubling) => {
                self.rd_gather.reset(count, n, ce, r, ctx);
                &mut self.rd_gather
            }
            (_, AlgoId::RecursiveDoubling) => {
                self.rd.reset(count, n, ce, r);
                &mut self.rd
            }
            (_, AlgoId::Ring) => {
                let (red, gat) = phases(kind);
                self.ring.reset(count, n, ce, red, gat, r);
                &mut self.ring
            }
            (_, AlgoId::Direct) => {
                let (red, gat) = phases(kind);
                self.direct.reset(count, n, ce, red, gat, r);
                &mut self.direct
            }
        };
        self.active = Some(Active {
            seq,
            kind,
            algo,
            count,
            barrier,
            tensor,
        });
        self.received_from.fill(0);
        // Failing from here on, the collective stays active: its number is
        // taken and some of its messages may be queued, so the caller is
        // out of step with its peers and must `abort` (the communicator
        // then fails, and its goodbye tells the peers).
        alg.start(ctx, buf)?;
        // Messages that arrived before this collective started.
        let mut at = 0;
        while let Some((from, bytes)) = self.next_early(seq, &mut at) {
            let res = self.dispatch(from, &bytes, user_buf);
            self.ctx.recycle(bytes);
            match res {
                Ok(Progress::Complete) => return Ok(Progress::Complete),
                Ok(Progress::Pending) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.check_done())
    }

    /// Whether `handle` takes this message now, rather than refusing it as
    /// too far ahead (more than `max_ahead` collectives) or for lack of
    /// room in the early buffer. A driver leaves a message it would refuse
    /// in its transport until this rank catches up, and the transport's
    /// flow control holds the sender back: a broadcast root, which waits
    /// for nobody, runs ahead as far as its sends are taken. A message that
    /// does not decode, or is stale, is "taken": `handle` reports it.
    pub fn takes_now(&self, bytes: &[u8]) -> bool {
        let Ok(msg) = message::decode(bytes) else {
            return true;
        };
        let seq = msg.header.seq;
        if self.active.as_ref().is_some_and(|a| a.seq == seq) {
            return true;
        }
        let ahead = seq.wrapping_sub(self.seq());
        ahead > u32::MAX / 2
            || (ahead <= self.config.max_ahead
                && self.early_bytes + bytes.len() <= self.config.max_early_bytes)
    }

    /// Feeds one message from `from`. `buf` is the running collective's
    /// buffer (any slice, e.g. `&mut []`, while idle or in a barrier).
    pub fn handle(&mut self, from: usize, bytes: &[u8], buf: &mut [f32]) -> Result<Progress> {
        self.ctx.counters.messages_received += 1;
        self.ctx.counters.bytes_received += bytes.len() as u64;
        if from >= self.ctx.world || from == self.ctx.rank {
            return Err(Error::RankOutOfRange {
                rank: from,
                world: self.ctx.world,
            });
        }
        let msg = message::decode(bytes)?;
        let seq = msg.header.seq;
        let current = self.seq();
        let ahead = seq.wrapping_sub(current);
        let running_this = self.active.as_ref().is_some_and(|a| a.seq == seq);
        if !running_this {
            if ahead > self.config.max_ahead {
                // Far "ahead" in wrapping arithmetic means behind.
                if ahead > u32::MAX / 2 {
                    return Err(Error::StaleMessage { from, seq, current });
                }
                return Err(Error::TooFarAhead { from, seq, current });
            }
            if self.early_bytes + bytes.len() > self.config.max_early_bytes {
                return Err(Error::EarlyBufferFull {
                    limit: self.config.max_early_bytes,
                });
            }
            self.ctx.counters.early_buffered += 1;
            self.early_bytes += bytes.len();
            let kept = self.ctx.keep(bytes);
            self.early.push_back((from, seq, kept));
            return Ok(Progress::Pending);
        }
        self.dispatch(from, bytes, buf)
    }

    fn dispatch(&mut self, from: usize, bytes: &[u8], buf: &mut [f32]) -> Result<Progress> {
        let msg = message::decode(bytes)?;
        let active = self
            .active
            .as_ref()
            .expect("dispatch runs with an active collective");
        if msg.header.kind != active.kind || msg.header.algo != active.algo {
            return Err(Error::Unexpected {
                from,
                reason: "collective kind or algorithm differs (ranks issued different collectives or configs)",
            });
        }
        let buf: &mut [f32] = if active.barrier {
            &mut self.barrier_cell
        } else {
            if buf.len() != active.count {
                return Err(Error::BufferLength {
                    got: buf.len(),
                    want: active.count,
                });
            }
            buf
        };
        let ctx = &mut self.ctx;
        let alg: &mut dyn Algorithm = match (active.kind, active.algo) {
            (Kind::Broadcast, _) => &mut self.broadcast,
            (Kind::AllGather, AlgoId::RecursiveDoubling) => &mut self.rd_gather,
            (_, AlgoId::RecursiveDoubling) => &mut self.rd,
            (_, AlgoId::Ring) => &mut self.ring,
            (_, AlgoId::Direct) => &mut self.direct,
        };
        alg.on_message(ctx, from, &msg, bytes, buf)?;
        self.received_from[from] += 1;
        debug_assert!(
            self.received_from[from] <= alg.expected_from(ctx, from),
            "rank {} took more messages from {from} than its algorithm expects",
            ctx.rank
        );
        Ok(self.check_done())
    }

    /// The peers from which the running collective still needs messages,
    /// by rank (empty while idle), each with whether it has entered the
    /// collective as far as this rank can tell ([`Owed::not_entered`]).
    pub fn owed(&self) -> Vec<Owed> {
        self.owed_iter().collect()
    }

    /// Whether the running collective still needs messages from `rank`.
    pub fn owes(&self, rank: usize) -> bool {
        self.owed_iter().any(|o| o.rank == rank)
    }

    fn owed_iter(&self) -> impl Iterator<Item = Owed> + '_ {
        let alg = self.running();
        (0..self.ctx.world)
            .filter_map(move |rank| {
                let alg = alg?;
                Some(Owed {
                    rank,
                    received: self.received_from[rank],
                    expected: alg.expected_from(&self.ctx, rank),
                    on_entry: alg.sent_on_entry(&self.ctx, rank),
                })
            })
            .filter(|o| o.received < o.expected)
    }

    fn running(&self) -> Option<&dyn Algorithm> {
        let a = self.active.as_ref()?;
        Some(match (a.kind, a.algo) {
            (Kind::Broadcast, _) => &self.broadcast,
            (Kind::AllGather, AlgoId::RecursiveDoubling) => &self.rd_gather,
            (_, AlgoId::RecursiveDoubling) => &self.rd,
            (_, AlgoId::Ring) => &self.ring,
            (_, AlgoId::Direct) => &self.direct,
        })
    }

    fn check_done(&mut self) -> Progress {
        if !self.running().is_some_and(|a| a.is_done()) {
            return Progress::Pending;
        }
        // Without allocating: steady-state collectives allocate nothing.
        debug_assert!(
            self.owed_iter().next().is_none(),
            "rank {} done while its algorithm expects more: {:?}",
            self.ctx.rank,
            self.owed()
        );
        if let Some(a) = &self.active {
            self.completed_seq = a.seq.wrapping_add(1);
        }
        self.finish(true);
        self.ctx.counters.wakeups += 1;
        Progress::Complete
    }

    fn finish(&mut self, completed: bool) {
        if let Some(a) = self.active.take() {
            if let (Some(t), Some(r)) = (a.tensor, self.ctx.residual.take()) {
                self.residuals.restore(t, r);
            }
            self.next_seq = a.seq.wrapping_add(1);
            self.drop_early(a.seq, completed);
        }
        self.ctx.residual = None;
    }

    /// Takes the next kept message of collective `seq` from `at` on (and
    /// leaves `at` where the next search goes on): its sender and bytes.
    fn next_early(&mut self, seq: u32, at: &mut usize) -> Option<(usize, Vec<u8>)> {
        while *at < self.early.len() {
            if self.early[*at].1 == seq {
                let (from, _, bytes) = self.early.remove(*at).expect("index checked");
                self.early_bytes -= bytes.len();
                return Some((from, bytes));
            }
            *at += 1;
        }
        None
    }

    /// Drops what is still kept of collective `seq`, which is over: after
    /// it completed, a message it did not take was a duplicate (a faulty
    /// or hostile peer's), and kept it would hold its share of
    /// `max_early_bytes` for ever (its number does not come again until
    /// the sequence wraps), until honest ranks' messages found no room.
    /// After an abort, the communicator has failed and nothing is lost.
    fn drop_early(&mut self, seq: u32, completed: bool) {
        let mut from_ranks = Vec::new();
        let mut at = 0;
        while let Some((from, bytes)) = self.next_early(seq, &mut at) {
            self.ctx.recycle(bytes);
            if !from_ranks.contains(&from) {
                from_ranks.push(from);
            }
        }
        if completed && !from_ranks.is_empty() {
            tracing::warn!(
                seq,
                ?from_ranks,
                "dropped messages that collective {seq} did not take (duplicates)"
            );
        }
    }

    /// Abandons the running collective (after an error); its sequence
    /// number is consumed so that later collectives line up with peers
    /// that also abort.
    pub fn abort(&mut self) {
        self.finish(false);
    }
}

fn phases(kind: Kind) -> (bool, bool) {
    match kind {
        Kind::ReduceScatter => (true, false),
        Kind::AllGather => (false, true),
        _ => (true, true),
    }
}
