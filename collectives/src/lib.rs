//! # ainftp collectives: the sans-IO engine
//!
//! Gradient collectives on caller-owned `f32` buffers — all-reduce (sum,
//! avg, max, min), reduce-scatter, all-gather, broadcast, barrier — as state
//! machines that never touch a socket. A transport driver (QUIC streams,
//! the [`sim`] simulator, anything reliable) moves the bytes.
//!
//! ## Driver contract
//!
//! ```text
//! let mut e = Engine::new(rank, world, Config::default())?;
//! e.start(Collective::all_reduce(ReduceOp::Sum), &mut buf)?;     // 1. start
//! loop {
//!     while let Some(out) = e.poll_send() {                       // 2. transmit
//!         transport.send(out.to, &out.bytes); e.recycle(out.bytes);
//!     }
//!     let (from, bytes) = transport.recv();                        // 3. deliver
//!     if e.handle(from, &bytes, &mut buf)? == Progress::Complete { break; }
//! }
//! ```
//!
//! * **Buffers.** Every event call (`start`, `handle`) gets the caller's
//!   `&mut [f32]` of the running collective; the engine reads and writes it
//!   in place and never copies it. All ops are in place (one buffer of the
//!   full length `count`, identical on all ranks):
//!   - `AllReduce`: input and result in `buf`.
//!   - `ReduceScatter`: input in `buf`; the result is this rank's shard
//!     [`shard_range`]`(count, world, rank)` of `buf`; the rest of `buf` is
//!     left unspecified (it holds partial sums).
//!   - `AllGather`: this rank's shard of `buf` is the input; all of `buf`
//!     is the result.
//!   - `Broadcast { root }`: the root's `buf` is copied to everyone.
//!   - `Barrier`: `buf` is ignored (pass `&mut []`).
//! * **Messages** are [`Outgoing`] `{ to, bytes }`: self-contained
//!   ([`message`] has the 32-byte header). The transport must be *reliable*
//!   but may reorder arbitrarily, also across collectives: messages of a
//!   collective this rank has not started yet are buffered (bounded by
//!   `Config::max_early_bytes` and `Config::max_ahead`, else an error; a
//!   transport with flow control asks [`Engine::takes_now`] and leaves
//!   such a message with the sender's flow until this rank catches up).
//!   While idle, call `handle` with any buffer (e.g. `&mut []`).
//! * **Completion.** `start`/`handle` return [`Progress::Complete`] exactly
//!   once per collective (counted in [`Counters::wakeups`]). All ranks must
//!   issue the same collectives, with the same buffer lengths and the same
//!   [`Config`], in the same order.
//! * **Timers.** None: the transport is reliable, and liveness (dead peers,
//!   stragglers) belongs to the layer above, which calls [`Engine::abort`].
//! * **Errors.** A malformed or unexpected message (wrong sender, step,
//!   geometry, duplicate, codec) is an [`Error`], never a panic. After an
//!   error the collective cannot complete; `abort` it.
//! * **Allocation.** Algorithm state, staging and message buffers are
//!   reused across collectives; a driver that `recycle`s sent buffers keeps
//!   the steady state allocation-free: pooled buffers only grow, and after
//!   a few collectives of a kind each fits every message (tested for every
//!   op, algorithm and codec in `tests/alloc.rs`). Sends are encoded
//!   eagerly during the event call that produces them (the buffer is only
//!   lent then).
//!
//! ## Algorithms and `Algo::Auto`
//!
//! * **Ring** (`algo/ring.rs`): reduce-scatter then all-gather around the
//!   ring, chunks (`Config::chunk_elems`, default 16384 f32 = 64 KiB)
//!   pipelined hop by hop; bandwidth-optimal (`2(N-1)/N` of the buffer per
//!   rank). Broadcast: a pipelined chain.
//! * **Direct** (`algo/direct.rs`): every rank sends each owner its
//!   contribution; the owner sums in a fixed order (its own values, then
//!   peers by ascending rank; early arrivals buffered) and sends the result
//!   to all. Only Direct lets a [`ContributionFilter`] see every
//!   contribution before summation. Broadcast: a star.
//! * **Recursive doubling** (`algo/rd.rs`): `log2 N` rounds of pairwise
//!   exchange of the whole buffer; non-powers of two fold the extra ranks
//!   in first and send them the result last. Broadcast: a binomial tree.
//!
//! `Algo::Auto` ([`Engine::algo_for`]), with `bytes = 4 * count`:
//! 1. barrier → recursive doubling;
//! 2. all-reduce / reduce-scatter with a filter installed → direct;
//! 3. `bytes <= Config::small_bytes` (64 KiB) → recursive doubling
//!    (latency-bound: `log2 N` rounds instead of `2(N-1)` steps);
//! 4. otherwise → ring.
//!
//! An explicit `Config::algo` overrides the rule (a filter with a non-direct
//! reduction is [`Error::FilterNeedsDirect`]). World size 1 completes in
//! `start` without messages.
//!
//! The threshold does not depend on the world size. In the alpha-beta
//! cost model the crossover, `S* = α(2(N-1) - log2 N) / β(log2 N -
//! 2(N-1)/N)`, moves little with `N`: `8α/β` at 4 ranks, `8.8α/β` at 8,
//! `12α/β` at 16 (two ranks move the same bytes either way), and
//! measurements agree: 4 ranks over kernel
//! UDP (README, "Algo::Auto by world size") found recursive doubling ahead
//! at 16-64 KiB and the ring from 256 KiB. With 3 ranks on 2 cores
//! recursive doubling led up to 16 MiB, an effect of three processes
//! sharing two cores that the rule does not encode.
//!
//! **Bit-identical results.** Every reduced element is produced by one
//! rank (ring, direct: the shard owner) or by a computation every rank
//! performs on the same operands (recursive doubling: `a + b == b + a` in
//! IEEE arithmetic, except the payload of a sum of two NaNs, so a NaN sum
//! is made the canonical NaN; max and min are made commutative to the
//! bit too: a NaN on either side gives the canonical NaN, and of +0 and -0
//! max takes +0 and min -0); results are then moved as the same encoded
//! bytes. Under
//! i16 the producer keeps the value its receivers decode from what it
//! sends: dequantized, then clamped to the clip bound as they clamp it.
//!
//! ## Codecs
//!
//! `Codec::F32` sends exact bytes. `Codec::I16(rounding)` implements this
//! spec exactly ([`codec`]; AVX-512F, AVX2 and scalar kernels are
//! bit-identical):
//!
//! ```text
//! chunk of n <= 65535 elements; absmax = max |x_i| (non-finite → error)
//! absmax == 0 → scale = 0, q = 0
//! scale = absmax / 32767.0f32;   inv = 32767.0f32 / absmax
//! nearest:    q_i = clamp(round_ties_even(x_i * inv), -32767, 32767)
//! stochastic: q_i = clamp(floor(x_i * inv + u_i), -32767, 32767)
//!             u_i = ((fmix32(seed) + i * 0x9E3779B9) mod 2^32 >> 8) as f32 * 2^-24
//! dequantize: y_i = (q_i as f32) * scale
//! accumulate: acc_i = acc_i + (q_i as f32) * scale    (no fma)
//! ```
//!
//! Two additions to the spec: if `32767 / absmax` overflows (absmax below
//! about 9.6e-35) the chunk is sent as zeros with scale 0 (the spec would
//! compute `0 * inf`); and a chunk whose scale would exceed
//! `message::MAX_SCALE` (absmax within about 2^-15 of `f32::MAX`, where
//! `32767 * scale` overflows) is refused with `Error::ScaleOverflow`, as a
//! non-finite input is.
//!
//! Receivers dequantize and fold straight from payload bytes into the f32
//! buffer; forwarded partial sums are re-quantized, final values are
//! forwarded verbatim. The stochastic seed is derived from
//! `(Config::seed, seq, step, chunk, salt)`.
//!
//! **Error feedback** (`Collective::with_feedback(tensor_id)`, sum and avg
//! under i16): before the collective `x' = x + r` and `r = 0`; every
//! quantization this rank performs of values that enter the result adds
//! its error `v - q*scale` to `r` (recursive doubling: only one member of a
//! group that quantizes identical values records it; the final value of an
//! average counts `N` times its error). Each step's error is re-injected in
//! the next, so the error of the running sum stays bounded and the mean
//! error over steps tends to zero. A residual has its tensor's length: a
//! collective of another length under the same id is refused
//! (`Error::ResidualLength`) until every rank calls `clear_residual(id)`
//! (`Engine`, `Communicator`), which also frees a tensor that is gone.
//!
//! ### Clip policy (one peer cannot ruin everyone's precision)
//!
//! Without a policy a peer announcing a huge scale (or a huge value) makes
//! every re-quantized chunk that contains it use a huge scale, zeroing all
//! honest values. With `Config::clip = Some(C)` (a bound on honest
//! per-element magnitudes, e.g. from gradient clipping):
//! 1. each rank clamps its own contribution to `[-C, C]` before sending
//!    (not fed back into the residual);
//! 2. a receiver clamps every dequantized value to `±k·C`, where `k` is the
//!    number of contributions the message *must* carry at that step
//!    (ring step `t`: `t+1`; direct: 1; final values: `N·C` for sums,
//!    `C` for averages, max, min, gathers and broadcasts). Recursive
//!    doubling is looser: round `s` clamps to `min(N, 2^(s+1))`, the
//!    contributions the receiver holds once it has folded the message in,
//!    up to twice the `2^s` the message carries (the sender keeps the
//!    same clamped value, so ranks stay bit-identical). `k` comes from the
//!    algorithm's state, never from the message.
//!
//! So every scale any honest rank uses is at most `N·C/32767`, whatever a
//! peer sends, and the attacker's influence on an element is at most its
//! clamp (`C` for a direct contribution). The clamp costs one min/max per
//! element in the accumulate kernel. `f32` payloads have no shared scale
//! and are not clipped.
//!
//! ### Error bound of the i16 path
//!
//! One quantization with scale `s` errs by at most `e·s`, with `e = 0.51`
//! for nearest (`0.5` plus f32 rounding of `x*inv` and `q*scale`, below
//! `4·32767·2^-24 < 0.008`) and `e = 1.01` for stochastic rounding. For a
//! chunk whose absmax is below about 3.9e-34 the scale is subnormal and
//! carries an absolute rounding error of its own: there `e` is 0.52 and
//! 1.02 (a chunk of values that small errs by less than 2e-34 anyway). A
//! reduced element carries the errors of every quantization on its path:
//!
//! ```text
//! |y - Σ_k x'_k| <= e · Σ_{m on path} s_m + (N-1) · 2^-24 · Σ_k |x'_k|
//! ```
//!
//! where `s_m` are the chunk scales of those messages. Each scale is at most
//! `A/32767` with `A = Σ_k absmax_k` (per-rank absmax of the chunk), and the
//! path length `Q` is: ring `N` (N-1 partial hops + the owner's final),
//! direct `N` (N-1 contributions + the final; the owner's own values are
//! exact), recursive doubling `2P-2+e ≤ 2N-2` (`P` the power of two, `e`
//! folded ranks; the result is not re-quantized). Hence
//! `|y - Σ x'| <= Q · e · A / 32767 + (N-1)·2^-24·A`; an average has this
//! bound divided by `N`; max/min have it without the last term. All-gather
//! and broadcast quantize once: `e · absmax / 32767`. The tests check
//! exactly this bound for every algorithm.

pub mod algo;
pub mod codec;
pub mod driver;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod message;
pub mod sim;

pub use algo::shard_range;
pub use codec::{Codec, Isa, Rounding};
pub use dtype::bf16;
pub use engine::{Config, Engine, Owed};
pub use error::{Error, Result};
pub use message::AlgoId;

/// Algorithm choice (`Auto`: the rule in the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algo {
    #[default]
    Auto,
    Ring,
    Direct,
    RecursiveDoubling,
}

/// Elementwise reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// Sum divided by the world size, once, by the producer of each value.
    Avg,
    /// Largest element; NaN where any rank has a NaN (the same bits on
    /// every rank); +0 over -0.
    Max,
    /// Smallest element; NaN where any rank has a NaN (the same bits on
    /// every rank); -0 over +0.
    Min,
}

/// A collective operation (buffer conventions in the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    AllReduce(ReduceOp),
    ReduceScatter(ReduceOp),
    AllGather,
    Broadcast { root: usize },
    Barrier,
}

/// What to run: an [`Op`], for i16 sums an error-feedback tensor id, and
/// optionally a codec other than the communicator's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collective {
    pub op: Op,
    pub tensor: Option<u64>,
    /// `None`: the communicator's codec (`Config::codec`).
    pub codec: Option<Codec>,
}

impl Collective {
    pub fn new(op: Op) -> Collective {
        Collective {
            op,
            tensor: None,
            codec: None,
        }
    }
    pub fn all_reduce(r: ReduceOp) -> Collective {
        Collective::new(Op::AllReduce(r))
    }
    pub fn reduce_scatter(r: ReduceOp) -> Collective {
        Collective::new(Op::ReduceScatter(r))
    }
    pub fn all_gather() -> Collective {
        Collective::new(Op::AllGather)
    }
    pub fn broadcast(root: usize) -> Collective {
        Collective::new(Op::Broadcast { root })
    }
    pub fn barrier() -> Collective {
        Collective::new(Op::Barrier)
    }
    /// Keeps an error-feedback residual under `tensor` (i16 sum/avg only;
    /// ignored otherwise); `clear_residual(tensor)` forgets it.
    pub fn with_feedback(mut self, tensor: u64) -> Collective {
        self.tensor = Some(tensor);
        self
    }
    /// Runs this collective with `codec` instead of the communicator's;
    /// every rank must pass the same (messages carry their codec, and a
    /// mismatch is refused). For values that must stay exact in a job
    /// whose gradients go as i16: a loss, a token count, a verdict.
    /// The clip policy and error feedback apply only to i16.
    pub fn with_codec(mut self, codec: Codec) -> Collective {
        self.codec = Some(codec);
        self
    }
}

/// Result of an event call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Pending,
    /// The collective finished during this call (reported once).
    Complete,
}

/// A message for the transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub to: usize,
    pub bytes: Vec<u8>,
}

/// Per-engine counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub bytes_sent: u64,
    pub messages_sent: u64,
    pub bytes_received: u64,
    pub messages_received: u64,
    /// Completions reported to the caller (one per collective).
    pub wakeups: u64,
    /// Messages that arrived before their collective started.
    pub early_buffered: u64,
}

/// Which chunk a [`ContributionFilter`] is looking at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    pub seq: u32,
    pub owner: usize,
    /// First element of the chunk in the buffer.
    pub offset: usize,
    pub len: usize,
}

/// Every rank's decoded contribution to one chunk, side by side.
pub struct Contributions<'a> {
    data: &'a mut [f32],
    len: usize,
    world: usize,
}

impl<'a> Contributions<'a> {
    pub(crate) fn new(data: &'a mut [f32], len: usize, world: usize) -> Self {
        Contributions { data, len, world }
    }
    pub fn world(&self) -> usize {
        self.world
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn get(&self, rank: usize) -> &[f32] {
        &self.data[rank * self.len..(rank + 1) * self.len]
    }
    /// Rewrite a contribution (e.g. zero or clip it) before summation.
    pub fn get_mut(&mut self, rank: usize) -> &mut [f32] {
        &mut self.data[rank * self.len..(rank + 1) * self.len]
    }
}

/// Robust-aggregation hook: runs on the shard owner (Direct algorithm) once
/// all contributions to a chunk are present, before they are summed in
/// rank order. It may inspect and rewrite any contribution; what it leaves
/// is summed (an average still divides by the world size).
pub trait ContributionFilter {
    fn inspect(&mut self, chunk: &ChunkInfo, contributions: &mut Contributions<'_>);
}
