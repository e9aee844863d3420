//! Wire codecs: `f32` (exact little-endian bytes) and `i16` with one f32
//! scale per chunk, plus the kernels that reduce straight from payload bytes
//! into an f32 accumulator.
//!
//! The i16 functions implement the crate-level spec bit for bit (see the
//! crate docs). [`Isa`] picks AVX-512F, AVX2 or scalar kernels at run time;
//! every path produces the same bits as [`scalar`].

pub mod feedback;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::message::{MAX_I16_CHUNK, MAX_SCALE};

/// How the i16 codec rounds `x * inv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rounding {
    /// Round half to even: deterministic, error <= scale / 2.
    #[default]
    Nearest,
    /// `floor(x * inv + u)`, `u` from a hash of (seed, element index):
    /// unbiased in expectation, error < scale.
    Stochastic,
}

/// Payload encoding chosen by the communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Codec {
    /// Exact f32 bytes.
    #[default]
    F32,
    /// i16 with a per-chunk f32 scale.
    I16(Rounding),
}

/// MurmurHash3's 32-bit finalizer.
pub fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// The stochastic-rounding offset `u_i` in [0, 1) for element `i` of a chunk:
/// a Weyl sequence (steps of the golden ratio) from a hashed seed.
///
/// Each `u_i` is uniform over seeds, which is all that unbiased rounding
/// needs, and neighbours are spread evenly rather than independently,
/// which only lowers the summed error of a chunk. It costs one add per
/// element in the SIMD kernels, where hashing every element (the earlier
/// spec) cost three 32-bit multiplies and held stochastic rounding to a
/// third of nearest's speed.
pub fn dither(seed: u32, i: u32) -> f32 {
    dither_at(dither_start(seed), i)
}

/// `dither` of element `i` of the chunk whose sequence starts at `start`.
pub(crate) fn dither_at(start: u32, i: u32) -> f32 {
    (start.wrapping_add(i.wrapping_mul(GOLDEN)) >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// 2^32 / golden ratio, odd: the Weyl step of `dither`.
pub(crate) const GOLDEN: u32 = 0x9E37_79B9;

/// Where a chunk's dither sequence starts.
pub(crate) fn dither_start(seed: u32) -> u32 {
    fmix32(seed)
}

/// Clamp to the symmetric i16 range; written as compares so that it matches
/// the SIMD min/max for every non-NaN input.
pub(crate) fn clamp_q(v: f32) -> f32 {
    let v = if v > 32767.0 { 32767.0 } else { v };
    if v < -32767.0 {
        -32767.0
    } else {
        v
    }
}

/// `v` clamped to `[-bound, bound]`, as the kernels clamp (max, then min).
pub(crate) fn clamp_to(v: f32, bound: f32) -> f32 {
    let v = if v < -bound { -bound } else { v };
    if v > bound {
        bound
    } else {
        v
    }
}

/// `(scale, inv)` for a chunk whose largest magnitude is `absmax`.
///
/// Returns `(0, 0)` (an all-zero chunk) when `absmax == 0` and also when
/// `32767 / absmax` overflows (absmax < ~9.6e-35): the spec leaves that case
/// undefined (`0 * inf` is NaN), and flushing costs at most 9.6e-35.
pub fn chunk_scale(absmax: f32) -> (f32, f32) {
    let inv = 32767.0f32 / absmax;
    if absmax == 0.0 || !inv.is_finite() {
        return (0.0, 0.0);
    }
    (absmax / 32767.0f32, inv)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// An instruction set whose kernels are safe to run on this CPU. Only
/// constructible through detection, so holding one proves support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isa(Level);

impl Isa {
    /// The portable reference kernels.
    pub fn scalar() -> Isa {
        Isa(Level::Scalar)
    }

    /// Every instruction set this CPU supports, scalar first.
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa(Level::Scalar)];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") {
                v.push(Isa(Level::Avx2));
            }
            if is_x86_feature_detected!("avx512f") {
                v.push(Isa(Level::Avx512));
            }
        }
        v
    }

    /// The fastest available instruction set (detected once).
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| *Isa::available().last().expect("scalar is always available"))
    }

    pub fn name(self) -> &'static str {
        match self.0 {
            Level::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => "avx512f",
        }
    }

    /// `max |x_i|`, or an error naming the first non-finite element.
    pub fn absmax(self, x: &[f32]) -> Result<f32> {
        let (m, bad) = match self.0 {
            Level::Scalar => scalar::absmax(x),
            // SAFETY: an Isa of this level exists only if the CPU supports it.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { x86::absmax_avx2(x) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { x86::absmax_avx512(x) },
        };
        match bad {
            Some(index) => Err(Error::NonFinite {
                index,
                value: x[index],
            }),
            None => Ok(m),
        }
    }

    /// Quantizes one chunk into `out` (2 bytes per element, i16 LE) and
    /// returns its scale.
    pub fn quantize(self, x: &[f32], rounding: Rounding, seed: u32, out: &mut [u8]) -> Result<f32> {
        if x.len() > MAX_I16_CHUNK {
            return Err(Error::ChunkTooLong(x.len()));
        }
        let absmax = self.absmax(x)?;
        self.quantize_with_absmax(x, absmax, rounding, seed, out)
    }

    /// `quantize` when `absmax` (`max |x_i|`, all finite) is already known,
    /// e.g. from `accumulate_absmax`: one pass over `x` instead of two.
    /// `absmax` must be exactly that (checked in debug builds only, since
    /// the check is the pass this saves): with a smaller one, values past
    /// ±32767 saturate differently in the scalar and the vector kernels,
    /// and ranks of different instruction sets would disagree.
    pub fn quantize_with_absmax(
        self,
        x: &[f32],
        absmax: f32,
        rounding: Rounding,
        seed: u32,
        out: &mut [u8],
    ) -> Result<f32> {
        if x.len() > MAX_I16_CHUNK {
            return Err(Error::ChunkTooLong(x.len()));
        }
        debug_assert!(
            x.iter().all(|v| v.abs() <= absmax),
            "absmax {absmax} is not max |x_i|"
        );
        let out = &mut out[..2 * x.len()];
        let (scale, inv) = chunk_scale(absmax);
        if scale > MAX_SCALE {
            // Receivers would refuse the scale, and 32767 * scale overflows.
            return Err(Error::ScaleOverflow { absmax });
        }
        if scale == 0.0 {
            out.fill(0);
            return Ok(0.0);
        }
        match (self.0, rounding) {
            (Level::Scalar, Rounding::Nearest) => scalar::quantize_nearest(x, inv, out),
            (Level::Scalar, Rounding::Stochastic) => scalar::quantize_stochastic(x, inv, seed, out),
            // SAFETY: an Isa of this level exists only if the CPU supports it.
            #[cfg(target_arch = "x86_64")]
            (Level::Avx2, Rounding::Nearest) => unsafe { x86::quantize_nearest_avx2(x, inv, out) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            (Level::Avx2, Rounding::Stochastic) => unsafe {
                x86::quantize_stochastic_avx2(x, inv, seed, out)
            },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            (Level::Avx512, Rounding::Nearest) => unsafe {
                x86::quantize_nearest_avx512(x, inv, out)
            },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            (Level::Avx512, Rounding::Stochastic) => unsafe {
                x86::quantize_stochastic_avx512(x, inv, seed, out)
            },
        }
        Ok(scale)
    }

    /// `out_i = (q_i as f32) * scale`. `payload.len()` must be `2 * out.len()`.
    pub fn dequantize(self, payload: &[u8], scale: f32, out: &mut [f32]) {
        assert_eq!(
            payload.len(),
            2 * out.len(),
            "payload/output length mismatch"
        );
        match self.0 {
            Level::Scalar => scalar::dequantize(payload, scale, out),
            // SAFETY: an Isa of this level exists only if the CPU supports it.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { x86::dequantize_avx2(payload, scale, out) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { x86::dequantize_avx512(payload, scale, out) },
        }
    }

    /// `acc_i = acc_i + clamp((q_i as f32) * scale, -bound, bound)`
    /// (multiply, clamp, then add; never fused). `bound = f32::INFINITY`
    /// disables the clamp. `payload.len()` must be `2 * acc.len()`.
    pub fn accumulate(self, acc: &mut [f32], payload: &[u8], scale: f32, bound: f32) {
        assert_eq!(
            payload.len(),
            2 * acc.len(),
            "payload/accumulator length mismatch"
        );
        match self.0 {
            Level::Scalar => scalar::accumulate(acc, payload, scale, bound),
            // SAFETY: an Isa of this level exists only if the CPU supports it.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { x86::accumulate_avx2(acc, payload, scale, bound) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { x86::accumulate_avx512(acc, payload, scale, bound) },
        }
    }

    /// `accumulate`, returning `max |acc_i|` of the result as `absmax`
    /// would (`None` if a result is not finite), measured in the same pass.
    /// A ring hop folds a chunk and then quantizes the partial sum it
    /// forwards: with this and `quantize_with_absmax` it reads the
    /// accumulator twice instead of three times.
    pub fn accumulate_absmax(
        self,
        acc: &mut [f32],
        payload: &[u8],
        scale: f32,
        bound: f32,
    ) -> Option<f32> {
        assert_eq!(
            payload.len(),
            2 * acc.len(),
            "payload/accumulator length mismatch"
        );
        match self.0 {
            Level::Scalar => scalar::accumulate_absmax(acc, payload, scale, bound),
            // SAFETY: an Isa of this level exists only if the CPU supports it.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { x86::accumulate_absmax_avx2(acc, payload, scale, bound) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { x86::accumulate_absmax_avx512(acc, payload, scale, bound) },
        }
    }
}

/// Appends `x` as f32 little-endian bytes.
pub fn encode_f32(x: &[f32], out: &mut Vec<u8>) {
    // The wire order is little-endian, which is the memory order here: one
    // copy instead of a loop of 4-byte appends.
    #[cfg(target_endian = "little")]
    out.extend_from_slice(bytemuck::cast_slice(x));
    #[cfg(not(target_endian = "little"))]
    for v in x {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// `a + v`, a NaN made the canonical one (a compare and a blend in the
/// vector loop): commutative to the bit.
#[inline(always)]
fn sum(a: f32, v: f32) -> f32 {
    let s = a + v;
    if s.is_nan() {
        f32::NAN
    } else {
        s
    }
}

fn f32_at(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// `out_i = payload_i` (f32 LE).
pub fn decode_f32(payload: &[u8], out: &mut [f32]) {
    #[cfg(target_endian = "little")]
    {
        let n = out.len().min(payload.len() / 4);
        bytemuck::cast_slice_mut::<f32, u8>(&mut out[..n]).copy_from_slice(&payload[..4 * n]);
    }
    #[cfg(not(target_endian = "little"))]
    for (o, b) in out.iter_mut().zip(payload.chunks_exact(4)) {
        *o = f32_at(b);
    }
}

/// Elementwise reduction applied when a contribution is folded into an
/// accumulator. `Avg` accumulates as `Sum` and divides once at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    Sum,
    Max,
    Min,
}

impl Combine {
    /// `a ⊕ v`, commutative to the bit: recursive doubling folds
    /// `mine ⊕ theirs` on one rank and `theirs ⊕ mine` on its partner, so
    /// a rule that kept the left operand on ties or NaN (`if v > a { v }
    /// else { a }`) gave the two ranks different results. A NaN on either
    /// side gives the canonical NaN (for a sum too: x86 keeps the first
    /// operand's NaN payload); of +0 and -0, max takes +0 and min -0.
    fn apply(self, a: f32, v: f32) -> f32 {
        match self {
            Combine::Sum => sum(a, v),
            Combine::Max | Combine::Min if a.is_nan() || v.is_nan() => f32::NAN,
            // Equal values differ at most in the sign of a zero.
            Combine::Max if a == v => f32::from_bits(a.to_bits() & v.to_bits()),
            Combine::Min if a == v => f32::from_bits(a.to_bits() | v.to_bits()),
            Combine::Max => {
                if v > a {
                    v
                } else {
                    a
                }
            }
            Combine::Min => {
                if v < a {
                    v
                } else {
                    a
                }
            }
        }
    }

    /// Folds an f32 payload into `acc`.
    pub fn f32_into(self, acc: &mut [f32], payload: &[u8]) {
        // One loop per operation, so each compiles to a vector loop.
        let pairs = acc.iter_mut().zip(payload.chunks_exact(4));
        match self {
            Combine::Sum => pairs.for_each(|(a, b)| *a = sum(*a, f32_at(b))),
            Combine::Max => pairs.for_each(|(a, b)| *a = Combine::Max.apply(*a, f32_at(b))),
            Combine::Min => pairs.for_each(|(a, b)| *a = Combine::Min.apply(*a, f32_at(b))),
        }
    }

    /// Folds an i16 payload into `acc`, dequantizing on the fly and
    /// clamping each value to `±bound` (the clip policy).
    pub fn i16_into(self, isa: Isa, acc: &mut [f32], payload: &[u8], scale: f32, bound: f32) {
        if self == Combine::Sum {
            return isa.accumulate(acc, payload, scale, bound);
        }
        for (a, q) in acc.iter_mut().zip(payload.chunks_exact(2)) {
            let v = i16::from_le_bytes([q[0], q[1]]) as f32 * scale;
            *a = self.apply(*a, clamp_to(v, bound));
        }
    }

    /// Folds a decoded f32 slice into `acc` (used after a filter ran).
    pub fn slice_into(self, acc: &mut [f32], values: &[f32]) {
        for (a, &v) in acc.iter_mut().zip(values) {
            *a = self.apply(*a, v);
        }
    }
}
