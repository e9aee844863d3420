//! Broadcast over three shapes, one per algorithm: a pipelined chain
//! around the ring (large buffers), a star from the root (direct) and a
//! binomial tree (recursive doubling, small buffers). The root encodes each
//! chunk once (holding the dequantized values itself under i16); every
//! other rank decodes and forwards the same bytes to its children.

use super::{check_chunk, chunk_range, mark_seen, num_chunks, Algorithm, Ctx, Quant};
use crate::error::{Error, Result};
use crate::message::{AlgoId, Message};

#[derive(Default)]
pub(crate) struct Broadcast {
    count: usize,
    root: usize,
    shape: Option<AlgoId>,
    seen: Vec<bool>,
    expected: usize,
    received: usize,
    /// The root's children and their steps (kept: no allocation per call).
    kids: Vec<(usize, u16)>,
}

impl Broadcast {
    pub fn reset(
        &mut self,
        count: usize,
        world: usize,
        chunk_elems: usize,
        rank: usize,
        root: usize,
        shape: AlgoId,
    ) {
        self.count = count;
        self.root = root;
        self.shape = Some(shape);
        let chunks = num_chunks(&(0..count), chunk_elems);
        self.seen.clear();
        self.seen.resize(chunks, false);
        self.received = 0;
        self.expected = if rank == root || world == 1 {
            0
        } else {
            chunks
        };
    }

    /// Distance from the root in rank order.
    fn rel(&self, ctx: &Ctx, rank: usize) -> usize {
        (rank + ctx.world - self.root) % ctx.world
    }

    fn abs(&self, ctx: &Ctx, rel: usize) -> usize {
        (rel + self.root) % ctx.world
    }

    /// `(parent, step of the edge into this rank)`.
    fn parent(&self, ctx: &Ctx) -> (usize, u16) {
        let d = self.rel(ctx, ctx.rank);
        match self.shape.expect("reset first") {
            AlgoId::Ring => (self.abs(ctx, d - 1), (d - 1) as u16),
            AlgoId::Direct => (self.root, 0),
            AlgoId::RecursiveDoubling => {
                let hb = usize::BITS - 1 - d.leading_zeros();
                (self.abs(ctx, d - (1 << hb)), hb as u16)
            }
        }
    }

    /// Sends `(to, step)` for each child of this rank.
    fn children(&self, ctx: &Ctx, mut each: impl FnMut(usize, u16)) {
        let d = self.rel(ctx, ctx.rank);
        let n = ctx.world;
        match self.shape.expect("reset first") {
            AlgoId::Ring => {
                if d + 1 < n {
                    each(self.abs(ctx, d + 1), d as u16);
                }
            }
            AlgoId::Direct => {
                if d == 0 {
                    for k in 1..n {
                        each(self.abs(ctx, k), 0);
                    }
                }
            }
            AlgoId::RecursiveDoubling => {
                let first = if d == 0 {
                    0
                } else {
                    usize::BITS - d.leading_zeros()
                };
                let mut s = first;
                while s < usize::BITS && d + (1 << s) < n {
                    each(self.abs(ctx, d + (1 << s)), s as u16);
                    s += 1;
                }
            }
        }
    }
}

impl Algorithm for Broadcast {
    fn start(&mut self, ctx: &mut Ctx, buf: &mut [f32]) -> Result<()> {
        if ctx.rank != self.root || ctx.world == 1 {
            return Ok(());
        }
        let mut kids = std::mem::take(&mut self.kids);
        kids.clear();
        self.children(ctx, |to, step| kids.push((to, step)));
        let span = 0..self.count;
        let q = Quant {
            salt: ctx.rank as u32,
            replace: Some(ctx.final_bound()),
            residual_weight: 0.0,
            absmax: None,
        };
        for c in 0..num_chunks(&span, ctx.chunk_elems) {
            let r = chunk_range(&span, ctx.chunk_elems, c);
            // One encoding per chunk; the step field is patched per child.
            let codec = ctx.codec;
            let bytes = ctx.encode(codec, 0, c, r.start, &mut buf[r], q)?;
            let m = crate::message::decode(&bytes)?;
            for &(to, step) in &kids {
                ctx.forward(to, &m, step);
            }
            ctx.recycle(bytes);
        }
        self.kids = kids;
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
        if ctx.rank == self.root {
            return Err(Error::Unexpected {
                from,
                reason: "the broadcast root receives nothing",
            });
        }
        let (parent, step) = self.parent(ctx);
        if from != parent || msg.header.step != step {
            return Err(Error::Unexpected {
                from,
                reason: "broadcast message from a rank that is not this rank's parent",
            });
        }
        ctx.check_codec(from, msg, ctx.codec_id())?;
        let (c, range) = check_chunk(from, msg, &(0..self.count), ctx.chunk_elems)?;
        mark_seen(&mut self.seen, c, from, msg)?;
        self.received += 1;
        ctx.decode_into(&mut buf[range], msg, ctx.final_bound());
        let mut kids = [(0usize, 0u16); 64];
        let mut k = 0;
        self.children(ctx, |to, step| {
            kids[k] = (to, step);
            k += 1;
        });
        for &(to, step) in &kids[..k] {
            ctx.forward(to, msg, step);
        }
        Ok(())
    }

    fn is_done(&self) -> bool {
        self.received == self.expected
    }

    fn expected_from(&self, ctx: &Ctx, peer: usize) -> usize {
        if ctx.rank == self.root || ctx.world == 1 || peer != self.parent(ctx).0 {
            0
        } else {
            self.expected
        }
    }

    fn sent_on_entry(&self, ctx: &Ctx, peer: usize) -> usize {
        // Only the root sends before it hears from anyone.
        if peer == self.root {
            self.expected_from(ctx, peer)
        } else {
            0
        }
    }
}
