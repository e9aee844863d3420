//! Recursive doubling for small messages (latency: log2 N rounds).
//!
//! Non-power-of-two worlds fold first: with `N = P + e` (`P` the largest
//! power of two <= N), each even rank `r < 2e` ("extra") sends its data to
//! `r + 1` (step 0) and waits; the `P` participants (virtual id `r / 2` for
//! odd `r < 2e`, else `r - e`) run `log2 P` exchange rounds with partner
//! `vid ^ 2^s` (step `1 + s`), then return the result to their extra rank
//! (step `log2 P + 1`, always f32 so the extra gets the exact bits).
//!
//! Bit-identity: after round `s` all members of a group hold the same
//! values, and each round computes `mine + theirs`, which IEEE addition (and
//! max/min) makes commutative. For i16 both sides first replace their own
//! values by the dequantized form they send, so both add the same two
//! operands. Group members quantize identical values with the same seed
//! salt, so only the group's leader records the error-feedback residual
//! (the error enters the result once).
//!
//! Chunks advance independently; a chunk's round-`s+1` message that
//! overtakes its round-`s` message is buffered.

use std::ops::Range;

use super::{check_chunk, chunk_range, mark_seen, num_chunks, shard_range, Algorithm, Ctx, Quant};
use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::message::{self, CodecId, Message};

/// A rank's place in the folded power-of-two layout.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub extras: usize,
    pub rounds: u32,
}

impl Layout {
    pub fn new(world: usize) -> Layout {
        let p = 1usize << (usize::BITS - 1 - world.leading_zeros());
        Layout {
            extras: world - p,
            rounds: p.trailing_zeros(),
        }
    }
    /// `Some(partner)` for a folded (waiting) rank.
    pub fn extra_partner(&self, rank: usize) -> Option<usize> {
        (rank < 2 * self.extras && rank.is_multiple_of(2)).then_some(rank + 1)
    }
    pub fn vid(&self, rank: usize) -> usize {
        if rank < 2 * self.extras {
            rank / 2
        } else {
            rank - self.extras
        }
    }
    /// The lowest rank a virtual id stands for.
    pub fn rank_lo(&self, vid: usize) -> usize {
        if vid < self.extras {
            2 * vid
        } else {
            vid + self.extras
        }
    }
    /// The participant's rank.
    pub fn rank_of(&self, vid: usize) -> usize {
        if vid < self.extras {
            2 * vid + 1
        } else {
            vid + self.extras
        }
    }
    /// Ranks covered by the group of `2^s` virtual ids containing `vid`.
    pub fn group_ranks(&self, vid: usize, s: u32) -> Range<usize> {
        let lo = vid >> s << s;
        let hi = lo + (1 << s) - 1;
        self.rank_lo(lo)..self.rank_of(hi) + 1
    }
    /// The round in which participants `rank` and `peer` are partners, if
    /// any (a participant has another partner in every round).
    pub fn round_with(&self, rank: usize, peer: usize) -> Option<u32> {
        let vid = self.vid(rank);
        (0..self.rounds).find(|&s| self.rank_of(vid ^ (1 << s)) == peer)
    }
    fn has_extra(&self, rank: usize) -> bool {
        rank < 2 * self.extras && rank % 2 == 1
    }
}

/// Recursive-doubling all-reduce (also serves reduce-scatter).
#[derive(Default)]
pub(crate) struct Rd {
    count: usize,
    /// Per chunk: 0 = waiting for the fold, `1 + s` = waiting for round `s`.
    stage: Vec<u32>,
    /// Early round messages: `s * chunks + c`.
    pending: Vec<Option<Vec<u8>>>,
    seen_unfold: Vec<bool>,
    chunks: usize,
    expected: usize,
    received: usize,
}

impl Rd {
    pub fn reset(&mut self, count: usize, world: usize, chunk_elems: usize, rank: usize) {
        let l = Layout::new(world);
        self.count = count;
        self.chunks = num_chunks(&(0..count), chunk_elems);
        let first = if l.has_extra(rank) { 0 } else { 1 };
        self.stage.clear();
        self.stage.resize(self.chunks, first);
        self.pending.clear();
        self.pending
            .resize_with(l.rounds as usize * self.chunks, || None);
        self.seen_unfold.clear();
        self.seen_unfold.resize(self.chunks, false);
        self.received = 0;
        self.expected = if world == 1 {
            0
        } else if l.extra_partner(rank).is_some() {
            self.chunks
        } else {
            self.chunks * (l.rounds as usize + usize::from(l.has_extra(rank)))
        };
    }

    fn send_round(
        &self,
        ctx: &mut Ctx,
        l: &Layout,
        buf: &mut [f32],
        c: usize,
        s: u32,
    ) -> Result<()> {
        let vid = l.vid(ctx.rank);
        let partner = l.rank_of(vid ^ (1 << s));
        let range = chunk_range(&(0..self.count), ctx.chunk_elems, c);
        let leader = vid & ((1 << s) - 1) == 0;
        let q = Quant {
            salt: (vid >> s) as u32,
            // The partner folds this with the bound of the contributions
            // it will hold after the round (`on_message`, `advance`).
            replace: Some(ctx.bound((2usize << s).min(ctx.world))),
            residual_weight: if leader { 1.0 } else { 0.0 },
            absmax: None,
        };
        ctx.send_chunk(partner, (1 + s) as u16, c, range.start, &mut buf[range], q)
    }

    /// Chunk `c` has finished the fold or round `stage - 1`: move it on.
    fn advance(&mut self, ctx: &mut Ctx, l: &Layout, buf: &mut [f32], c: usize) -> Result<()> {
        loop {
            let s = self.stage[c] - 1; // next round to run
            if s < l.rounds {
                self.send_round(ctx, l, buf, c, s)?;
                let Some(early) = self.pending[s as usize * self.chunks + c].take() else {
                    return Ok(());
                };
                let m = message::decode(&early)?;
                let range = chunk_range(&(0..self.count), ctx.chunk_elems, c);
                ctx.fold(&mut buf[range], &m, (2usize << s).min(ctx.world));
                ctx.recycle(early);
                self.stage[c] += 1;
                continue;
            }
            let range = chunk_range(&(0..self.count), ctx.chunk_elems, c);
            ctx.finalize(&mut buf[range.clone()], None);
            if l.has_extra(ctx.rank) {
                let q = Quant {
                    salt: 0,
                    replace: None,
                    residual_weight: 0.0,
                    absmax: None,
                };
                let bytes = ctx.encode(
                    Codec::F32,
                    (l.rounds + 1) as u16,
                    c,
                    range.start,
                    &mut buf[range],
                    q,
                )?;
                ctx.send_copy(ctx.rank - 1, &bytes);
                ctx.recycle(bytes);
            }
            return Ok(());
        }
    }
}

impl Algorithm for Rd {
    fn start(&mut self, ctx: &mut Ctx, buf: &mut [f32]) -> Result<()> {
        if ctx.world == 1 {
            ctx.finalize(buf, None);
            return Ok(());
        }
        let l = Layout::new(ctx.world);
        if let Some(partner) = l.extra_partner(ctx.rank) {
            for c in 0..self.chunks {
                let range = chunk_range(&(0..self.count), ctx.chunk_elems, c);
                ctx.send_chunk(
                    partner,
                    0,
                    c,
                    range.start,
                    &mut buf[range],
                    Quant::partial(ctx.rank),
                )?;
            }
            return Ok(());
        }
        if !l.has_extra(ctx.rank) {
            for c in 0..self.chunks {
                self.advance(ctx, &l, buf, c)?;
            }
        }
        Ok(())
    }

    fn on_message(
        &mut self,
        ctx: &mut Ctx,
        from: usize,
        msg: &Message<'_>,
        bytes: &[u8],
        buf: &mut [f32],
    ) -> Result<()> {
        let l = Layout::new(ctx.world);
        let step = u32::from(msg.header.step);
        let span = 0..self.count;
        if let Some(partner) = l.extra_partner(ctx.rank) {
            if from != partner || step != l.rounds + 1 {
                return Err(Error::Unexpected {
                    from,
                    reason: "a folded rank only expects the result from its partner",
                });
            }
            ctx.check_codec(from, msg, CodecId::F32)?;
            let (c, range) = check_chunk(from, msg, &span, ctx.chunk_elems)?;
            mark_seen(&mut self.seen_unfold, c, from, msg)?;
            self.received += 1;
            ctx.decode_into(&mut buf[range], msg, f32::INFINITY);
            return Ok(());
        }
        ctx.check_codec(from, msg, ctx.codec_id())?;
        let (c, range) = check_chunk(from, msg, &span, ctx.chunk_elems)?;
        let vid = l.vid(ctx.rank);
        let expected_from = match step {
            0 if l.has_extra(ctx.rank) => ctx.rank - 1,
            s if s >= 1 && s <= l.rounds => l.rank_of(vid ^ (1 << (s - 1))),
            _ => usize::MAX,
        };
        if from != expected_from {
            return Err(Error::Unexpected {
                from,
                reason: "recursive-doubling message from a rank that is not this round's partner",
            });
        }
        let dup = Error::Duplicate {
            from,
            step: msg.header.step,
            chunk: c as u32,
        };
        if step < self.stage[c] {
            return Err(dup);
        }
        if step > self.stage[c] {
            let slot = (step - 1) as usize * self.chunks + c;
            if self.pending[slot].is_some() {
                return Err(dup);
            }
            self.received += 1;
            self.pending[slot] = Some(ctx.keep(bytes));
            return Ok(());
        }
        self.received += 1;
        let contributions = if step == 0 {
            1
        } else {
            (1usize << step).min(ctx.world)
        };
        ctx.fold(&mut buf[range], msg, contributions);
        self.stage[c] += 1;
        self.advance(ctx, &l, buf, c)
    }

    fn is_done(&self) -> bool {
        self.received == self.expected && self.pending.iter().all(Option::is_none)
    }

    fn expected_from(&self, ctx: &Ctx, peer: usize) -> usize {
        let l = Layout::new(ctx.world);
        if ctx.world == 1 || peer == ctx.rank {
            return 0;
        }
        if let Some(partner) = l.extra_partner(ctx.rank) {
            return if peer == partner { self.chunks } else { 0 };
        }
        // Every chunk once from the folded rank and once per round from
        // that round's partner.
        let from_extra = l.has_extra(ctx.rank) && peer == ctx.rank - 1;
        let partner = l.round_with(ctx.rank, peer).is_some();
        self.chunks * (usize::from(partner) + usize::from(from_extra))
    }

    fn sent_on_entry(&self, ctx: &Ctx, peer: usize) -> usize {
        let l = Layout::new(ctx.world);
        if ctx.world == 1 || peer == ctx.rank || l.extra_partner(ctx.rank).is_some() {
            return 0;
        }
        // A folded rank sends its data at once, and so does a round-0
        // partner that has no folded rank to wait for.
        let folded = l.has_extra(ctx.rank) && peer == ctx.rank - 1;
        let first_partner = l.round_with(ctx.rank, peer) == Some(0);
        if folded || (first_partner && !l.has_extra(peer)) {
            self.chunks
        } else {
            0
        }
    }
}

/// Recursive-doubling all-gather: each round forwards every chunk message
/// the group holds, verbatim, so all ranks decode the owners' bytes.
#[derive(Default)]
pub(crate) struct RdGather {
    count: usize,
    /// Messages held for forwarding, tagged with the round that may send
    /// them (own and folded: 0; received in round `s`: `s + 1`).
    held: Vec<(u32, Vec<u8>)>,
    /// Round whose sends went out (`u32::MAX` before the first).
    sent_round: Option<u32>,
    received_in: Vec<usize>,
    expected_in: Vec<usize>,
    max_chunks: usize,
    seen: Vec<bool>,
    expected: usize,
    received: usize,
}

impl RdGather {
    pub fn reset(
        &mut self,
        count: usize,
        world: usize,
        chunk_elems: usize,
        rank: usize,
        ctx: &mut Ctx,
    ) {
        let l = Layout::new(world);
        self.count = count;
        for (_, b) in self.held.drain(..) {
            ctx.recycle(b);
        }
        self.sent_round = None;
        let chunks_of = shard_chunks(count, world, chunk_elems);
        self.max_chunks = chunks_of(0);
        self.seen.clear();
        self.seen.resize(world * self.max_chunks, false);
        self.received = 0;
        // Index 0: the fold; 1 + s: round s.
        self.received_in.clear();
        self.received_in.resize(l.rounds as usize + 2, 0);
        self.expected_in.clear();
        self.expected_in.resize(l.rounds as usize + 2, 0);
        if world == 1 {
            self.expected = 0;
            return;
        }
        if l.extra_partner(rank).is_some() {
            self.expected = (0..world).filter(|&p| p != rank).map(chunks_of).sum();
            return;
        }
        gather_inputs(&l, rank, chunks_of, &mut self.expected_in);
        self.expected = self.expected_in.iter().sum();
    }

    fn own_chunks(&mut self, ctx: &mut Ctx, buf: &mut [f32]) -> Result<()> {
        let span = shard_range(self.count, ctx.world, ctx.rank);
        let q = Quant {
            salt: ctx.rank as u32,
            replace: Some(ctx.final_bound()),
            residual_weight: 0.0,
            absmax: None,
        };
        for c in 0..num_chunks(&span, ctx.chunk_elems) {
            let r = chunk_range(&span, ctx.chunk_elems, c);
            let codec = ctx.codec;
            let bytes = ctx.encode(codec, 0, c, r.start, &mut buf[r], q)?;
            self.held.push((0, bytes));
        }
        Ok(())
    }

    /// Sends every round whose inputs are complete.
    fn pump(&mut self, ctx: &mut Ctx, l: &Layout) -> Result<()> {
        let vid = l.vid(ctx.rank);
        loop {
            if self.sent_round.is_some_and(|s| s >= l.rounds) {
                return Ok(());
            }
            let next = self.sent_round.map_or(0, |s| s + 1);
            // Round `next` may go once the fold and rounds < next are in.
            let ready = (0..=next as usize).all(|i| self.received_in[i] == self.expected_in[i]);
            if !ready {
                return Ok(());
            }
            let (to, step) = if next < l.rounds {
                (l.rank_of(vid ^ (1 << next)), (1 + next) as u16)
            } else if next == l.rounds && l.has_extra(ctx.rank) {
                (ctx.rank - 1, (l.rounds + 1) as u16)
            } else {
                self.sent_round = Some(next);
                return Ok(());
            };
            for i in 0..self.held.len() {
                if self.held[i].0 <= next {
                    let bytes = std::mem::take(&mut self.held[i].1);
                    let m = message::decode(&bytes)?;
                    // The folded rank already has its own shard.
                    if shard_of(self.count, ctx.world, m.header.offset) != Some(to) {
                        ctx.forward(to, &m, step);
                    }
                    self.held[i].1 = bytes;
                }
            }
            self.sent_round = Some(next);
            if next >= l.rounds {
                return Ok(());
            }
        }
    }
}

impl Algorithm for RdGather {
    fn start(&mut self, ctx: &mut Ctx, buf: &mut [f32]) -> Result<()> {
        if ctx.world == 1 {
            return Ok(());
        }
        self.own_chunks(ctx, buf)?;
        let l = Layout::new(ctx.world);
        if let Some(partner) = l.extra_partner(ctx.rank) {
            for (_, b) in self.held.drain(..) {
                ctx.send_copy(partner, &b);
                ctx.recycle(b);
            }
            return Ok(());
        }
        self.pump(ctx, &l)
    }

    fn on_message(
        &mut self,
        ctx: &mut Ctx,
        from: usize,
        msg: &Message<'_>,
        bytes: &[u8],
        buf: &mut [f32],
    ) -> Result<()> {
        let l = Layout::new(ctx.world);
        ctx.check_codec(from, msg, ctx.codec_id())?;
        let step = u32::from(msg.header.step);
        let owner = shard_of(self.count, ctx.world, msg.header.offset);
        let allowed = if let Some(partner) = l.extra_partner(ctx.rank) {
            from == partner && step == l.rounds + 1 && owner != Some(ctx.rank)
        } else {
            let vid = l.vid(ctx.rank);
            match step {
                0 => l.has_extra(ctx.rank) && from == ctx.rank - 1 && owner == Some(from),
                s if s >= 1 && s <= l.rounds => {
                    let partner_vid = vid ^ (1 << (s - 1));
                    from == l.rank_of(partner_vid)
                        && owner.is_some_and(|o| l.group_ranks(partner_vid, s - 1).contains(&o))
                }
                _ => false,
            }
        };
        let Some(owner) = owner.filter(|_| allowed) else {
            return Err(Error::Unexpected {
                from,
                reason: "all-gather message for a shard this round does not carry",
            });
        };
        let span = shard_range(self.count, ctx.world, owner);
        let (c, range) = check_chunk(from, msg, &span, ctx.chunk_elems)?;
        mark_seen(&mut self.seen, owner * self.max_chunks + c, from, msg)?;
        self.received += 1;
        ctx.decode_into(&mut buf[range], msg, ctx.final_bound());
        if l.extra_partner(ctx.rank).is_some() {
            return Ok(());
        }
        let idx = step.min(l.rounds + 1) as usize;
        self.received_in[idx] += 1;
        self.held.push((step, ctx.keep(bytes)));
        self.pump(ctx, &l)
    }

    fn is_done(&self) -> bool {
        self.received == self.expected
    }

    fn expected_from(&self, ctx: &Ctx, peer: usize) -> usize {
        let l = Layout::new(ctx.world);
        if ctx.world == 1 || peer == ctx.rank {
            return 0;
        }
        if let Some(partner) = l.extra_partner(ctx.rank) {
            return if peer == partner { self.expected } else { 0 };
        }
        let from_extra = if l.has_extra(ctx.rank) && peer == ctx.rank - 1 {
            self.expected_in[0]
        } else {
            0
        };
        let round = l.round_with(ctx.rank, peer);
        from_extra + round.map_or(0, |s| self.expected_in[1 + s as usize])
    }

    fn sent_on_entry(&self, ctx: &Ctx, peer: usize) -> usize {
        let l = Layout::new(ctx.world);
        if ctx.world == 1 || peer == ctx.rank {
            return 0;
        }
        let chunks_of = shard_chunks(self.count, ctx.world, ctx.chunk_elems);
        // A folded rank sends its own chunks at once.
        if l.has_extra(ctx.rank) && peer == ctx.rank - 1 {
            return chunks_of(peer);
        }
        // A participant sends its own chunks (all it holds before it hears
        // from anyone) in each round whose inputs, and all earlier ones,
        // are empty (shards of no elements), and back to its folded rank
        // after the last round if all are.
        let last = if l.extra_partner(ctx.rank) == Some(peer) {
            l.rounds
        } else {
            match l.round_with(peer, ctx.rank) {
                Some(s) => s,
                None => return 0,
            }
        };
        // On the stack: the engine checks this after every collective,
        // whose steady state allocates nothing.
        let mut inputs = [0; usize::BITS as usize + 2];
        let inputs = &mut inputs[..l.rounds as usize + 2];
        gather_inputs(&l, peer, chunks_of, inputs);
        if inputs[..=last as usize].iter().all(|&n| n == 0) {
            chunks_of(peer)
        } else {
            0
        }
    }
}

/// How many chunks rank `p`'s shard has.
fn shard_chunks(count: usize, world: usize, chunk_elems: usize) -> impl Fn(usize) -> usize + Copy {
    move |p| num_chunks(&shard_range(count, world, p), chunk_elems)
}

/// What participant `rank` of an all-gather takes in before each of its
/// sends: `inputs[0]` from its folded rank, `inputs[1 + s]` in round `s`
/// (`inputs` is zeroed first; it has `rounds + 2` entries).
fn gather_inputs(
    l: &Layout,
    rank: usize,
    chunks_of: impl Fn(usize) -> usize,
    inputs: &mut [usize],
) {
    inputs.fill(0);
    if l.has_extra(rank) {
        inputs[0] = chunks_of(rank - 1);
    }
    let vid = l.vid(rank);
    for s in 0..l.rounds {
        inputs[1 + s as usize] = l.group_ranks(vid ^ (1 << s), s).map(&chunks_of).sum();
    }
}

/// The rank whose shard contains element `offset`.
fn shard_of(count: usize, world: usize, offset: u64) -> Option<usize> {
    let offset = usize::try_from(offset).ok()?;
    if offset >= count {
        return None;
    }
    let base = count / world;
    let rem = count % world;
    let big = (base + 1) * rem;
    Some(if offset < big {
        offset / (base + 1)
    } else {
        rem + (offset - big) / base
    })
}
