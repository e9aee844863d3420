//! Plain scalar reference of the i16 + scale codec, written from the spec
//! line by line (test-only): the GPU kernels must match it bit for bit.
#![allow(dead_code)]

pub const QMAX: f32 = 32767.0;

pub fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// u_i of stochastic rounding, in [0, 1).
pub fn uniform(seed: u32, i: u32) -> f32 {
    (fmix32(seed ^ i.wrapping_mul(0x9E37_79B9)) >> 8) as f32 * (1.0 / 16_777_216.0)
}

#[derive(Clone, Copy, Debug)]
pub enum Mode {
    Nearest,
    Stochastic(u32),
}

/// Quantize one chunk (x' = x + r when a residual is given; r is updated).
/// Returns the chunk's scale.
pub fn quantize_chunk(x: &[f32], r: Option<&mut [f32]>, mode: Mode, q: &mut [i16]) -> f32 {
    let xs: Vec<f32> = match &r {
        Some(r) => x.iter().zip(r.iter()).map(|(a, b)| a + b).collect(),
        None => x.to_vec(),
    };
    let absmax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let (scale, inv) = if absmax == 0.0 {
        (0.0f32, 0.0f32)
    } else {
        (absmax / QMAX, QMAX / absmax)
    };
    for (i, (&v, qi)) in xs.iter().zip(q.iter_mut()).enumerate() {
        *qi = if absmax == 0.0 {
            0
        } else {
            let t = match mode {
                Mode::Nearest => (v * inv).round_ties_even(),
                Mode::Stochastic(seed) => (v * inv + uniform(seed, i as u32)).floor(),
            };
            t.clamp(-QMAX, QMAX) as i16
        };
    }
    if let Some(r) = r {
        for ((ri, &v), &qi) in r.iter_mut().zip(&xs).zip(q.iter()) {
            *ri = v - (qi as f32) * scale;
        }
    }
    scale
}

/// Quantize a whole buffer chunk by chunk; returns the scales.
pub fn quantize(
    x: &[f32],
    mut r: Option<&mut [f32]>,
    chunk: usize,
    mode: Mode,
    q: &mut [i16],
) -> Vec<f32> {
    let mut scales = Vec::new();
    for (c, xc) in x.chunks(chunk).enumerate() {
        let range = c * chunk..c * chunk + xc.len();
        let rc = r.as_deref_mut().map(|r| &mut r[range.clone()]);
        scales.push(quantize_chunk(xc, rc, mode, &mut q[range]));
    }
    scales
}

pub fn dequantize(q: &[i16], scales: &[f32], chunk: usize) -> Vec<f32> {
    q.iter()
        .enumerate()
        .map(|(i, &qi)| (qi as f32) * scales[i / chunk])
        .collect()
}

pub fn accumulate(acc: &mut [f32], q: &[i16], scales: &[f32], chunk: usize) {
    for (i, (a, &qi)) in acc.iter_mut().zip(q).enumerate() {
        let prod = (qi as f32) * scales[i / chunk];
        *a += prod;
    }
}
