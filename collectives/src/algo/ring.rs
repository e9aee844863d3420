//! Ring reduce-scatter + all-gather with pipelined chunks.
//!
//! Block `b` is rank `b`'s shard. Reduce-scatter step `t` (0..N-1): rank `r`
//! sends block `r-t-1` to its right neighbour and receives block `r-t-2`
//! from its left, adds its own contribution, and forwards the partial sum
//! one step later; at `t = N-2` the received block is `r`, now fully
//! reduced. All-gather steps `N-1+t`: the owner sends its final block, each
//! rank decodes and forwards the same bytes. Every block is touched once
//! per phase, so chunks need no ordering: each is handled on arrival,
//! which is what pipelines them.
//!
//! Summation order of block `b` is fixed by the ring (`b+1, b+2, ..., b`),
//! and the owner alone produces the final values, so all ranks agree bit
//! for bit.

use super::{check_chunk, chunk_range, mark_seen, num_chunks, shard_range, Algorithm, Ctx, Quant};
use crate::error::{Error, Result};
use crate::message::Message;

#[derive(Default)]
pub(crate) struct Ring {
    count: usize,
    reduce: bool,
    gather: bool,
    max_chunks: usize,
    seen: Vec<bool>,
    left: usize,
    expected: usize,
    received: usize,
}

impl Ring {
    /// `reduce`: run the reduce-scatter phase; `gather`: the all-gather phase.
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
        self.max_chunks = num_chunks(&shard_range(count, world, 0), chunk_elems);
        self.seen.clear();
        self.seen
            .resize(2 * world.saturating_sub(1) * self.max_chunks, false);
        self.received = 0;
        let chunks_of = |b: usize| num_chunks(&shard_range(count, world, b), chunk_elems);
        let left = (rank + world - 1) % world;
        self.left = left;
        self.expected = 0;
        if world > 1 {
            if reduce {
                // Every block except the one this rank sends first.
                self.expected += (0..world)
                    .filter(|&b| b != left)
                    .map(chunks_of)
                    .sum::<usize>();
            }
            if gather {
                self.expected += (0..world)
                    .filter(|&b| b != rank)
                    .map(chunks_of)
                    .sum::<usize>();
            }
        }
    }

    fn block(rank: usize, world: usize, back: usize) -> usize {
        (rank + world * 2 - back % world) % world
    }

    /// Sends this rank's final block, or one chunk of it; `absmax` is the
    /// chunk's `max |v|` when the fold measured it.
    fn send_final_block(
        &self,
        ctx: &mut Ctx,
        buf: &mut [f32],
        block: usize,
        chunk: Option<usize>,
        absmax: Option<f32>,
    ) -> Result<()> {
        let span = shard_range(self.count, ctx.world, block);
        let right = (ctx.rank + 1) % ctx.world;
        let step = (ctx.world - 1) as u16;
        let weight = if ctx.kind == crate::message::Kind::AllGather {
            0.0
        } else {
            ctx.final_weight()
        };
        let q = Quant {
            salt: ctx.rank as u32,
            replace: Some(ctx.final_bound()),
            residual_weight: weight,
            absmax: chunk.and(absmax),
        };
        let chunks = match chunk {
            Some(c) => c..c + 1,
            None => 0..num_chunks(&span, ctx.chunk_elems),
        };
        for c in chunks {
            let r = chunk_range(&span, ctx.chunk_elems, c);
            ctx.send_chunk(right, step, c, r.start, &mut buf[r.clone()], q)?;
        }
        Ok(())
    }
}

impl Algorithm for Ring {
    fn start(&mut self, ctx: &mut Ctx, buf: &mut [f32]) -> Result<()> {
        let (n, r) = (ctx.world, ctx.rank);
        if n == 1 {
            return Ok(());
        }
        if self.reduce {
            let b = Self::block(r, n, 1);
            let span = shard_range(self.count, n, b);
            for c in 0..num_chunks(&span, ctx.chunk_elems) {
                let range = chunk_range(&span, ctx.chunk_elems, c);
                ctx.send_chunk(
                    (r + 1) % n,
                    0,
                    c,
                    range.start,
                    &mut buf[range.clone()],
                    Quant::partial(r),
                )?;
            }
        } else {
            self.send_final_block(ctx, buf, r, None, None)?;
        }
        Ok(())
    }

    fn on_message(
        &mut self,
        ctx: &mut Ctx,
        from: usize,
        msg: &Message<'_>,
        _bytes: &[u8],
        buf: &mut [f32],
    ) -> Result<()> {
        let (n, r) = (ctx.world, ctx.rank);
        let left = (r + n - 1) % n;
        if from != left {
            return Err(Error::Unexpected {
                from,
                reason: "ring messages come from the left neighbour only",
            });
        }
        ctx.check_codec(from, msg, ctx.codec_id())?;
        let step = msg.header.step as usize;
        let reduce_steps = n - 1;
        let (in_reduce, t) = if step < reduce_steps {
            (true, step)
        } else {
            (false, step - reduce_steps)
        };
        if (in_reduce && !self.reduce) || (!in_reduce && (!self.gather || t >= n - 1)) {
            return Err(Error::Unexpected {
                from,
                reason: "ring step outside this collective's phases",
            });
        }
        let block = if in_reduce {
            Self::block(r, n, t + 2)
        } else {
            Self::block(r, n, t + 1)
        };
        let span = shard_range(self.count, n, block);
        let (c, range) = check_chunk(from, msg, &span, ctx.chunk_elems)?;
        mark_seen(&mut self.seen, step * self.max_chunks + c, from, msg)?;
        self.received += 1;
        if in_reduce {
            let absmax = ctx.fold(&mut buf[range.clone()], msg, t + 1);
            if t + 2 < n {
                ctx.send_chunk(
                    (r + 1) % n,
                    (t + 1) as u16,
                    c,
                    range.start,
                    &mut buf[range],
                    Quant::partial(r).measured(absmax),
                )?;
            } else {
                // This rank owns the block: the chunk is final.
                let absmax = ctx.finalize(&mut buf[range], absmax);
                if self.gather {
                    self.send_final_block(ctx, buf, block, Some(c), absmax)?;
                }
            }
        } else {
            ctx.decode_into(&mut buf[range], msg, ctx.final_bound());
            if t + 2 < n {
                ctx.forward((r + 1) % n, msg, (step + 1) as u16);
            }
        }
        Ok(())
    }

    fn is_done(&self) -> bool {
        self.received == self.expected
    }

    fn expected_from(&self, ctx: &Ctx, peer: usize) -> usize {
        if peer == self.left && peer != ctx.rank {
            self.expected
        } else {
            0
        }
    }
    fn sent_on_entry(&self, ctx: &Ctx, peer: usize) -> usize {
        if peer != self.left || peer == ctx.rank {
            return 0;
        }
        // The left neighbour starts with its first reduce-scatter block,
        // or with its own block when there is no reduce-scatter phase.
        let n = ctx.world;
        let first = if self.reduce {
            Self::block(peer, n, 1)
        } else if self.gather {
            peer
        } else {
            return 0;
        };
        num_chunks(&shard_range(self.count, n, first), ctx.chunk_elems)
    }
}
