//! Direct (butterfly) reduce-scatter + all-gather.
//!
//! Rank `r` owns shard `r`. Every peer sends its contribution to shard `r`
//! straight to `r` (step 0); `r` folds them in a fixed order (its own
//! values first, then peers in ascending rank), buffering contributions
//! that arrive ahead of their turn, and sends the reduced shard to every
//! peer (step 1, the same bytes to all).
//!
//! With a [`ContributionFilter`](crate::ContributionFilter) installed the
//! owner waits for every contribution of a chunk, decodes them side by side
//! and lets the filter inspect (and rewrite) them before summation.

use super::{check_chunk, chunk_range, mark_seen, num_chunks, shard_range, Algorithm, Ctx, Quant};
use crate::error::{Error, Result};
use crate::message::{self, Message};
use crate::{ChunkInfo, Contributions};

#[derive(Default)]
pub(crate) struct Direct {
    count: usize,
    reduce: bool,
    gather: bool,
    /// Per own chunk: how many peers (in order) are folded in.
    next: Vec<usize>,
    /// Early contributions: `chunk * (world - 1) + peer position`.
    pending: Vec<Option<Vec<u8>>>,
    max_chunks: usize,
    seen_final: Vec<bool>,
    expected: usize,
    received: usize,
}

fn position(peer: usize, owner: usize) -> usize {
    if peer < owner {
        peer
    } else {
        peer - 1
    }
}

fn peer_at(pos: usize, owner: usize) -> usize {
    if pos < owner {
        pos
    } else {
        pos + 1
    }
}

impl Direct {
    pub fn reset(
        &mut self,
        count: usize,
        world: usize,
        chunk_elems: usize,
        reduce: bool,
        gather: bool,
        rank: usize,
    ) {
        self.count = count;
        self.reduce = reduce;
        self.gather = gather;
        let own_chunks = num_chunks(&shard_range(count, world, rank), chunk_elems);
        self.next.clear();
        self.next.resize(own_chunks, 0);
        self.pending.clear();
        self.pending
            .resize_with(own_chunks * world.saturating_sub(1), || None);
        self.max_chunks = num_chunks(&shard_range(count, world, 0), chunk_elems);
        self.seen_final.clear();
        self.seen_final.resize(world * self.max_chunks, false);
        self.received = 0;
        self.expected = 0;
        if reduce {
            self.expected += (world - 1) * own_chunks;
        }
        if gather {
            self.expected += (0..world)
                .filter(|&p| p != rank)
                .map(|p| num_chunks(&shard_range(count, world, p), chunk_elems))
                .sum::<usize>();
        }
    }

    fn send_final(&self, ctx: &mut Ctx, buf: &mut [f32], c: usize) -> Result<()> {
        let span = shard_range(self.count, ctx.world, ctx.rank);
        let r = chunk_range(&span, ctx.chunk_elems, c);
        let weight = if self.reduce { ctx.final_weight() } else { 0.0 };
        let q = Quant {
            salt: ctx.rank as u32,
            replace: Some(ctx.final_bound()),
            residual_weight: weight,
            absmax: None,
        };
        let codec = ctx.codec;
        let bytes = ctx.encode(codec, 1, c, r.start, &mut buf[r], q)?;
        let (n, me) = (ctx.world, ctx.rank);
        for p in (0..n).filter(|&p| p != me) {
            ctx.send_copy(p, &bytes);
        }
        ctx.recycle(bytes);
        Ok(())
    }

    /// All contributions of own chunk `c` are present: run the filter, sum
    /// in order, write the result.
    fn reduce_filtered(&mut self, ctx: &mut Ctx, buf: &mut [f32], c: usize) -> Result<()> {
        let (n, r) = (ctx.world, ctx.rank);
        let span = shard_range(self.count, n, r);
        let range = chunk_range(&span, ctx.chunk_elems, c);
        let len = range.len();
        let mut staging = std::mem::take(&mut ctx.staging);
        staging.clear();
        staging.resize(n * len, 0.0);
        staging[r * len..(r + 1) * len].copy_from_slice(&buf[range.clone()]);
        let one = ctx.bound(1);
        for pos in 0..n - 1 {
            let p = peer_at(pos, r);
            let bytes = self.pending[c * (n - 1) + pos]
                .take()
                .expect("all contributions present");
            let msg = message::decode(&bytes)?;
            ctx.decode_into(&mut staging[p * len..(p + 1) * len], &msg, one);
            ctx.recycle(bytes);
        }
        let info = ChunkInfo {
            seq: ctx.seq,
            owner: r,
            offset: range.start,
            len,
        };
        if let Some(f) = ctx.filter.as_mut() {
            f.inspect(&info, &mut Contributions::new(&mut staging, len, n));
        }
        let acc = &mut buf[range];
        acc.copy_from_slice(&staging[r * len..(r + 1) * len]);
        for p in (0..n).filter(|&p| p != r) {
            ctx.combine
                .slice_into(acc, &staging[p * len..(p + 1) * len]);
        }
        ctx.staging = staging;
        Ok(())
    }

    fn chunk_reduced(&mut self, ctx: &mut Ctx, buf: &mut [f32], c: usize) -> Result<()> {
        let span = shard_range(self.count, ctx.world, ctx.rank);
        let range = chunk_range(&span, ctx.chunk_elems, c);
        ctx.finalize(&mut buf[range], None);
        if self.gather && ctx.world > 1 {
            self.send_final(ctx, buf, c)?;
        }
        Ok(())
    }
}

impl Algorithm for Direct {
    fn start(&mut self, ctx: &mut Ctx, buf: &mut [f32]) -> Result<()> {
        let (n, r) = (ctx.world, ctx.rank);
        if self.reduce {
            for p in (0..n).filter(|&p| p != r) {
                let span = shard_range(self.count, n, p);
                for c in 0..num_chunks(&span, ctx.chunk_elems) {
                    let range = chunk_range(&span, ctx.chunk_elems, c);
                    ctx.send_chunk(
                        p,
                        0,
                        c,
                        range.start,
                        &mut buf[range.clone()],
                        Quant::partial(r),
                    )?;
                }
            }
            if n == 1 {
                for c in 0..self.next.len() {
                    self.chunk_reduced(ctx, buf, c)?;
                }
            }
        } else if n > 1 {
            for c in 0..num_chunks(&shard_range(self.count, n, r), ctx.chunk_elems) {
                self.send_final(ctx, buf, c)?;
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
        let (n, r) = (ctx.world, ctx.rank);
        ctx.check_codec(from, msg, ctx.codec_id())?;
        match msg.header.step {
            0 if self.reduce => {
                let span = shard_range(self.count, n, r);
                let (c, range) = check_chunk(from, msg, &span, ctx.chunk_elems)?;
                let pos = position(from, r);
                let slot = c * (n - 1) + pos;
                if pos < self.next[c] || self.pending[slot].is_some() {
                    return Err(Error::Duplicate {
                        from,
                        step: 0,
                        chunk: c as u32,
                    });
                }
                self.received += 1;
                if ctx.filter.is_some() {
                    self.pending[slot] = Some(ctx.keep(bytes));
                    let have = (0..n - 1).all(|p| self.pending[c * (n - 1) + p].is_some());
                    if have {
                        self.next[c] = n - 1;
                        self.reduce_filtered(ctx, buf, c)?;
                        self.chunk_reduced(ctx, buf, c)?;
                    }
                    return Ok(());
                }
                if pos != self.next[c] {
                    self.pending[slot] = Some(ctx.keep(bytes));
                    return Ok(());
                }
                ctx.fold(&mut buf[range.clone()], msg, 1);
                self.next[c] += 1;
                while self.next[c] < n - 1 {
                    let Some(early) = self.pending[c * (n - 1) + self.next[c]].take() else {
                        break;
                    };
                    let m = message::decode(&early)?;
                    ctx.fold(&mut buf[range.clone()], &m, 1);
                    ctx.recycle(early);
                    self.next[c] += 1;
                }
                if self.next[c] == n - 1 {
                    self.chunk_reduced(ctx, buf, c)?;
                }
                Ok(())
            }
            1 if self.gather => {
                let span = shard_range(self.count, n, from);
                let (c, range) = check_chunk(from, msg, &span, ctx.chunk_elems)?;
                mark_seen(&mut self.seen_final, from * self.max_chunks + c, from, msg)?;
                self.received += 1;
                ctx.decode_into(&mut buf[range], msg, ctx.final_bound());
                Ok(())
            }
            _ => Err(Error::Unexpected {
                from,
                reason: "direct step outside this collective's phases",
            }),
        }
    }

    fn is_done(&self) -> bool {
        self.received == self.expected
    }

    fn expected_from(&self, ctx: &Ctx, peer: usize) -> usize {
        if peer == ctx.rank {
            return 0;
        }
        // The peer's contribution to each of this rank's chunks, then its
        // own shard's final chunks.
        let contributions = if self.reduce { self.next.len() } else { 0 };
        let finals = if self.gather {
            num_chunks(&shard_range(self.count, ctx.world, peer), ctx.chunk_elems)
        } else {
            0
        };
        contributions + finals
    }

    fn sent_on_entry(&self, ctx: &Ctx, peer: usize) -> usize {
        if peer == ctx.rank {
            return 0;
        }
        // Contributions go out at once; finals only after their shard is
        // reduced, unless there is nothing to reduce.
        if self.reduce {
            self.next.len()
        } else if self.gather {
            num_chunks(&shard_range(self.count, ctx.world, peer), ctx.chunk_elems)
        } else {
            0
        }
    }
}
