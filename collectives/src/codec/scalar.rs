//! Reference (scalar) kernels: the normative form of the i16 spec. The SIMD
//! kernels must produce the same bits; tests compare them element by element.

use super::{clamp_q, clamp_to, dither_at, dither_start};

/// `(max |x_i|, first non-finite index)`.
pub fn absmax(x: &[f32]) -> (f32, Option<usize>) {
    let mut m = 0.0f32;
    for (i, &v) in x.iter().enumerate() {
        let a = v.abs();
        // Catches NaN as well as infinities.
        if !a.is_finite() {
            return (m, Some(i));
        }
        if a > m {
            m = a;
        }
    }
    (m, None)
}

pub fn quantize_nearest(x: &[f32], inv: f32, out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
        let q = clamp_q((v * inv).round_ties_even()) as i16;
        o.copy_from_slice(&q.to_le_bytes());
    }
}

pub fn quantize_stochastic(x: &[f32], inv: f32, seed: u32, out: &mut [u8]) {
    let start = dither_start(seed);
    for (i, (v, o)) in x.iter().zip(out.chunks_exact_mut(2)).enumerate() {
        let u = dither_at(start, i as u32);
        // Separate multiply and add (no fma), exactly as the spec.
        let t = v * inv;
        let q = clamp_q((t + u).floor()) as i16;
        o.copy_from_slice(&q.to_le_bytes());
    }
}

pub fn dequantize(payload: &[u8], scale: f32, out: &mut [f32]) {
    for (o, q) in out.iter_mut().zip(payload.chunks_exact(2)) {
        *o = i16::from_le_bytes([q[0], q[1]]) as f32 * scale;
    }
}

/// `acc_i = acc_i + clamp((q_i as f32) * scale, -bound, bound)`.
pub fn accumulate(acc: &mut [f32], payload: &[u8], scale: f32, bound: f32) {
    for (a, q) in acc.iter_mut().zip(payload.chunks_exact(2)) {
        let v = i16::from_le_bytes([q[0], q[1]]) as f32 * scale;
        let v = clamp_to(v, bound);
        *a += v;
    }
}

/// `accumulate`, also returning `max |acc_i|` of the updated accumulator
/// (what `absmax` would return), or `None` if an updated value is not
/// finite. One pass where a hop that forwards its partial sum would
/// otherwise read the accumulator twice.
pub fn accumulate_absmax(acc: &mut [f32], payload: &[u8], scale: f32, bound: f32) -> Option<f32> {
    let mut m = 0.0f32;
    let mut finite = true;
    for (a, q) in acc.iter_mut().zip(payload.chunks_exact(2)) {
        let v = i16::from_le_bytes([q[0], q[1]]) as f32 * scale;
        let v = clamp_to(v, bound);
        *a += v;
        let x = a.abs();
        finite &= x.is_finite();
        if x > m {
            m = x;
        }
    }
    finite.then_some(m)
}
