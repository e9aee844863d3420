//! Collective algorithms as sans-IO state machines, and the context
//! (`Ctx`) through which they encode, send and fold messages.
//!
//! Every algorithm works on chunks of a contiguous element range and keeps a
//! fixed reduction order, so the result never depends on arrival order.

pub(crate) mod broadcast;
pub(crate) mod direct;
pub(crate) mod rd;
pub(crate) mod ring;

use std::collections::VecDeque;
use std::ops::Range;

use crate::codec::{self, Codec, Combine, Isa};
use crate::error::{Error, Result};
use crate::message::{self, AlgoId, CodecId, Header, Kind, Message, HEADER_LEN};
use crate::{ContributionFilter, Counters, Outgoing};

/// The elements rank `i` owns in reduce-scatter / all-gather: a balanced
/// contiguous partition (the first `count % world` ranks get one more).
pub fn shard_range(count: usize, world: usize, i: usize) -> Range<usize> {
    let base = count / world;
    let rem = count % world;
    let start = i * base + i.min(rem);
    start..start + base + usize::from(i < rem)
}

pub(crate) fn num_chunks(span: &Range<usize>, chunk_elems: usize) -> usize {
    span.len().div_ceil(chunk_elems)
}

pub(crate) fn chunk_range(span: &Range<usize>, chunk_elems: usize, c: usize) -> Range<usize> {
    let start = span.start + c * chunk_elems;
    start..(start + chunk_elems).min(span.end)
}

/// How an outgoing chunk is quantized (ignored by the f32 codec).
#[derive(Clone, Copy)]
pub(crate) struct Quant {
    /// Mixed into the stochastic-rounding seed; ranks that quantize the same
    /// values (recursive doubling groups) must use the same salt.
    pub salt: u32,
    /// `Some(bound)`: replace the local values by what every receiver
    /// decodes from the message (dequantized, then clamped to the `bound`
    /// the receivers clamp to), so that the sender holds the same bits.
    pub replace: Option<f32>,
    /// Weight of this quantization's error in the error-feedback residual
    /// (0: not recorded; N for an average produced by dividing by N).
    pub residual_weight: f32,
    /// `max |v|` of the values when the fold that produced them measured
    /// it (`Ctx::fold`): quantizing then skips its own pass to find it.
    pub absmax: Option<f32>,
}

impl Quant {
    pub fn partial(salt: usize) -> Quant {
        Quant {
            salt: salt as u32,
            replace: None,
            residual_weight: 1.0,
            absmax: None,
        }
    }

    /// The same, for values whose absmax the fold measured.
    pub fn measured(self, absmax: Option<f32>) -> Quant {
        Quant { absmax, ..self }
    }
}

/// State shared by all algorithms: identity, configuration, the current
/// collective's parameters, the outbox and the buffer pool.
pub(crate) struct Ctx {
    pub rank: usize,
    pub world: usize,
    pub chunk_elems: usize,
    pub isa: Isa,
    pub seed: u64,
    pub clip: f32,
    pub outbox: VecDeque<Outgoing>,
    pub pool: Vec<Vec<u8>>,
    /// Capacity of the buffers in `pool`, in bytes.
    pub pool_bytes: usize,
    pub counters: Counters,
    pub filter: Option<Box<dyn ContributionFilter + Send>>,
    pub staging: Vec<f32>,
    // Per collective:
    pub seq: u32,
    pub kind: Kind,
    pub algo: AlgoId,
    pub codec: Codec,
    pub combine: Combine,
    pub avg: bool,
    pub residual: Option<Vec<f32>>,
}

/// Most bytes of message buffers kept for reuse (a few hundred 64 KiB
/// chunks; a driver that never recycles just allocates).
const MAX_POOL_BYTES: usize = 32 << 20;

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Ctx {
    pub fn codec_id(&self) -> CodecId {
        match self.codec {
            Codec::F32 => CodecId::F32,
            Codec::I16(_) => CodecId::I16,
        }
    }

    fn take_buf(&mut self) -> Vec<u8> {
        let mut b = self.take_as_is();
        b.clear();
        b
    }

    /// A pooled buffer of `len` bytes whose contents the caller overwrites
    /// whole: a reused buffer keeps its old bytes, so only growth beyond
    /// its last length is zeroed (a pass over every message otherwise).
    fn take_len(&mut self, len: usize) -> Vec<u8> {
        let mut b = self.take_as_is();
        b.resize(len, 0);
        b
    }

    fn take_as_is(&mut self) -> Vec<u8> {
        let b = self.pool.pop().unwrap_or_default();
        self.pool_bytes -= b.capacity();
        b
    }

    pub fn recycle(&mut self, b: Vec<u8>) {
        // Bounded in bytes: the pool holds what the peak of a collective
        // had in flight, and gives back what is beyond this. Small ones
        // are kept too: a buffer only grows, so after a few collectives
        // every pooled one fits every message, the last, short chunk of a
        // bucket included (not keeping those cost an allocation each).
        let keep = b.capacity() > 0;
        if keep && self.pool_bytes + b.capacity() <= MAX_POOL_BYTES {
            self.pool_bytes += b.capacity();
            self.pool.push(b);
        }
    }

    fn push(&mut self, to: usize, bytes: Vec<u8>) {
        self.counters.messages_sent += 1;
        self.counters.bytes_sent += bytes.len() as u64;
        self.outbox.push_back(Outgoing { to, bytes });
    }

    fn seed_for(&self, step: u16, chunk: u32, salt: u32) -> u32 {
        let mut h = splitmix64(self.seed ^ u64::from(self.seq));
        h = splitmix64(h ^ u64::from(step));
        h = splitmix64(h ^ u64::from(chunk));
        h = splitmix64(h ^ u64::from(salt));
        h as u32
    }

    fn header(
        &self,
        codec: CodecId,
        step: u16,
        chunk: usize,
        offset: usize,
        count: usize,
    ) -> Header {
        Header {
            kind: self.kind,
            algo: self.algo,
            codec,
            step,
            seq: self.seq,
            chunk: chunk as u32,
            offset: offset as u64,
            count: count as u32,
            scale: 0.0,
        }
    }

    /// Encodes `values` (elements `offset..`) into a pooled buffer.
    pub fn encode(
        &mut self,
        codec: Codec,
        step: u16,
        chunk: usize,
        offset: usize,
        values: &mut [f32],
        q: Quant,
    ) -> Result<Vec<u8>> {
        let out = match codec {
            Codec::F32 => {
                let mut out = self.take_buf();
                let h = self.header(CodecId::F32, step, chunk, offset, values.len());
                out.resize(HEADER_LEN, 0);
                h.write((&mut out[..HEADER_LEN]).try_into().expect("header size"));
                codec::encode_f32(values, &mut out);
                out
            }
            Codec::I16(rounding) => {
                let seed = self.seed_for(step, chunk as u32, q.salt);
                // Every byte is written below: header, then all payload.
                let mut out = self.take_len(HEADER_LEN + 2 * values.len());
                let payload = &mut out[HEADER_LEN..];
                let scale = match q.absmax {
                    Some(m) => {
                        // A measured absmax must be the one a pass would
                        // find, bit for bit (tests run with debug asserts).
                        debug_assert_eq!(
                            self.isa.absmax(values).ok().map(f32::to_bits),
                            Some(m.to_bits()),
                            "measured absmax differs"
                        );
                        self.isa
                            .quantize_with_absmax(values, m, rounding, seed, payload)?
                    }
                    None => self.isa.quantize(values, rounding, seed, payload)?,
                };
                let mut h = self.header(CodecId::I16, step, chunk, offset, values.len());
                h.scale = scale;
                h.write((&mut out[..HEADER_LEN]).try_into().expect("header size"));
                let payload = &out[HEADER_LEN..];
                match self.residual.as_mut().filter(|_| q.residual_weight != 0.0) {
                    Some(r) => {
                        let r = &mut r[offset..offset + values.len()];
                        for ((v, ri), b) in values.iter_mut().zip(r).zip(payload.chunks_exact(2)) {
                            let d = i16::from_le_bytes([b[0], b[1]]) as f32 * scale;
                            // The residual is the quantization error only:
                            // what the clip cuts off is not fed back.
                            *ri += q.residual_weight * (*v - d);
                            if let Some(bound) = q.replace {
                                // As `accumulate` into zero: clamp, then 0 + v.
                                *v = 0.0 + codec::clamp_to(d, bound);
                            }
                        }
                    }
                    None => {
                        if let Some(bound) = q.replace {
                            self.decode_i16(values, payload, scale, bound);
                        }
                    }
                }
                out
            }
        };
        Ok(out)
    }

    /// Encodes and queues one chunk for `to`.
    pub fn send_chunk(
        &mut self,
        to: usize,
        step: u16,
        chunk: usize,
        offset: usize,
        values: &mut [f32],
        q: Quant,
    ) -> Result<()> {
        let bytes = self.encode(self.codec, step, chunk, offset, values, q)?;
        self.push(to, bytes);
        Ok(())
    }

    /// Queues a copy of already-encoded bytes for `to`.
    pub fn send_copy(&mut self, to: usize, bytes: &[u8]) {
        let mut b = self.take_buf();
        b.extend_from_slice(bytes);
        self.push(to, b);
    }

    /// Forwards a received message verbatim except for its step, so every
    /// receiver decodes the very same payload bytes.
    pub fn forward(&mut self, to: usize, msg: &Message<'_>, step: u16) {
        let mut h = msg.header;
        h.step = step;
        let mut b = self.take_buf();
        message::encode(&h, msg.payload, &mut b);
        self.push(to, b);
    }

    pub fn check_codec(&self, from: usize, msg: &Message<'_>, want: CodecId) -> Result<()> {
        if msg.header.codec != want {
            return Err(Error::Unexpected {
                from,
                reason: "codec differs from the collective's (ranks disagree on Config::codec or Collective::with_codec)",
            });
        }
        Ok(())
    }

    /// Clip bound for a value that aggregates `contributions` inputs.
    pub fn bound(&self, contributions: usize) -> f32 {
        match self.combine {
            Combine::Sum => self.clip * contributions as f32,
            Combine::Max | Combine::Min => self.clip,
        }
    }

    /// Folds a contribution into `acc` straight from the payload bytes.
    /// Returns `max |acc_i|` afterwards when it came for free (an i16 sum,
    /// all finite), for `Quant::measured`.
    pub fn fold(&self, acc: &mut [f32], msg: &Message<'_>, contributions: usize) -> Option<f32> {
        let bound = self.bound(contributions);
        match msg.header.codec {
            CodecId::F32 => self.combine.f32_into(acc, msg.payload),
            CodecId::I16 if self.combine == Combine::Sum => {
                return self
                    .isa
                    .accumulate_absmax(acc, msg.payload, msg.header.scale, bound);
            }
            CodecId::I16 => {
                self.combine
                    .i16_into(self.isa, acc, msg.payload, msg.header.scale, bound)
            }
        }
        None
    }

    /// Overwrites `out` with a message's values (clamped to `bound`).
    pub fn decode_into(&self, out: &mut [f32], msg: &Message<'_>, bound: f32) {
        match msg.header.codec {
            CodecId::F32 => codec::decode_f32(msg.payload, out),
            CodecId::I16 => self.decode_i16(out, msg.payload, msg.header.scale, bound),
        }
    }

    /// Overwrites `out` with an i16 payload's values clamped to `bound`:
    /// what receivers decode, and what a sender that replaces keeps.
    fn decode_i16(&self, out: &mut [f32], payload: &[u8], scale: f32, bound: f32) {
        if bound.is_finite() {
            // 0 + v == v exactly (v is never -0.0), so this is a clamped decode.
            out.fill(0.0);
            self.isa.accumulate(out, payload, scale, bound);
        } else {
            self.isa.dequantize(payload, scale, out);
        }
    }

    /// Bound for a final (fully reduced or gathered) value.
    pub fn final_bound(&self) -> f32 {
        if self.avg || self.kind == Kind::AllGather || self.kind == Kind::Broadcast {
            self.clip
        } else {
            self.bound(self.world)
        }
    }

    /// Turns a finished sum into the requested result (`Avg` divides once).
    /// Returns the result's `max |v|` from the sum's, `absmax`, if known:
    /// dividing by `n > 0` rounds monotonically and symmetrically, so the
    /// largest quotient is the quotient of the largest, bit for bit.
    pub fn finalize(&self, values: &mut [f32], absmax: Option<f32>) -> Option<f32> {
        if !self.avg {
            return absmax;
        }
        let n = self.world as f32;
        for v in values.iter_mut() {
            *v /= n;
        }
        absmax.map(|m| m / n)
    }

    /// Residual weight of the final quantization of a reduced value.
    pub fn final_weight(&self) -> f32 {
        if self.avg {
            self.world as f32
        } else {
            1.0
        }
    }

    /// Copies a message into a pooled buffer (for early arrivals).
    pub fn keep(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut b = self.take_buf();
        b.extend_from_slice(bytes);
        b
    }
}

/// Validates that `msg` is chunk `header.chunk` of `span` and returns
/// `(chunk, element range)`.
pub(crate) fn check_chunk(
    from: usize,
    msg: &Message<'_>,
    span: &Range<usize>,
    chunk_elems: usize,
) -> Result<(usize, Range<usize>)> {
    let c = msg.header.chunk as usize;
    if c >= num_chunks(span, chunk_elems) {
        return Err(Error::Unexpected {
            from,
            reason: "chunk index outside the block",
        });
    }
    let r = chunk_range(span, chunk_elems, c);
    if msg.header.offset != r.start as u64 || msg.header.count as usize != r.len() {
        return Err(Error::Unexpected {
            from,
            reason: "chunk offset/count disagree with the collective's geometry (ranks disagree on chunk size or buffer length)",
        });
    }
    Ok((c, r))
}

/// One running algorithm.
pub(crate) trait Algorithm {
    fn start(&mut self, ctx: &mut Ctx, buf: &mut [f32]) -> Result<()>;
    fn on_message(
        &mut self,
        ctx: &mut Ctx,
        from: usize,
        msg: &Message<'_>,
        bytes: &[u8],
        buf: &mut [f32],
    ) -> Result<()>;
    fn is_done(&self) -> bool;
    /// How many messages of the running collective this rank takes from
    /// `peer` in all (0 for a rank it hears nothing from). Summed over the
    /// peers, it is what `is_done` waits for; a stalled collective names
    /// the peers that still owe some.
    fn expected_from(&self, ctx: &Ctx, peer: usize) -> usize;
    /// How many of those the peer sends as soon as it enters the
    /// collective, before it hears from anyone: a peer that has sent none
    /// of them has not entered it (one that owes only later messages may
    /// be waiting on another).
    fn sent_on_entry(&self, ctx: &Ctx, peer: usize) -> usize;
}

/// Marks `(slot)` as seen, failing on a duplicate.
pub(crate) fn mark_seen(
    seen: &mut [bool],
    slot: usize,
    from: usize,
    msg: &Message<'_>,
) -> Result<()> {
    if std::mem::replace(&mut seen[slot], true) {
        return Err(Error::Duplicate {
            from,
            step: msg.header.step,
            chunk: msg.header.chunk,
        });
    }
    Ok(())
}
