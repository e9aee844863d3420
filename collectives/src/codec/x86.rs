//! AVX2 and AVX-512F kernels. Each mirrors a function of `scalar.rs` and
//! must produce the same bits: same operations in the same order, no fma,
//! round/floor instructions with the spec's rounding mode, and the tails
//! handed to the scalar kernel (the element index `i` is kept so that
//! stochastic dither matches).

use core::arch::x86_64::*;

use super::scalar;

const QMAX: f32 = 32767.0;
const GOLDEN: i32 = super::GOLDEN as i32;
const TWO_POW_M24: f32 = 1.0 / 16_777_216.0;

// ---------------------------------------------------------------- AVX2

#[target_feature(enable = "avx2")]
pub fn absmax_avx2(x: &[f32]) -> (f32, Option<usize>) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let max_finite = _mm256_set1_ps(f32::MAX);
    // Four independent max chains hide the max latency.
    let mut m = [_mm256_setzero_ps(); 4];
    let mut bad = _mm256_setzero_ps();
    let body = x.len() / 32 * 32;
    let mut i = 0;
    while i < body {
        for (k, mk) in m.iter_mut().enumerate() {
            // SAFETY: i + 32 <= x.len(); loadu has no alignment requirement.
            let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(i + 8 * k)) };
            let a = _mm256_and_ps(v, abs_mask);
            // Unordered "not <=" flags NaN and infinities.
            bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLE_UQ>(a, max_finite));
            *mk = _mm256_max_ps(*mk, a);
        }
        i += 32;
    }
    if _mm256_movemask_ps(bad) != 0 {
        return scalar::absmax(x);
    }
    let m = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    let mut lanes = [0f32; 8];
    // SAFETY: lanes holds 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    let (tail, bad_tail) = scalar::absmax(&x[body..]);
    if let Some(j) = bad_tail {
        return (0.0, Some(body + j));
    }
    (
        lanes
            .iter()
            .fold(tail, |acc, &v| if v > acc { v } else { acc }),
        None,
    )
}

#[target_feature(enable = "avx2")]
fn clamp_q_avx2(v: __m256) -> __m256i {
    let v = _mm256_max_ps(
        _mm256_min_ps(v, _mm256_set1_ps(QMAX)),
        _mm256_set1_ps(-QMAX),
    );
    // Already integral: the conversion is exact.
    _mm256_cvtps_epi32(v)
}

#[target_feature(enable = "avx2")]
fn store_i16x16(out: &mut [u8], at: usize, lo: __m256i, hi: __m256i) {
    // packs works per 128-bit lane; restore element order with a permute.
    let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(lo, hi));
    debug_assert!(out.len() >= 2 * at + 32);
    // SAFETY: callers guarantee 2 * (at + 16) <= out.len(); storeu is unaligned.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(2 * at) as *mut __m256i, packed) };
}

#[target_feature(enable = "avx2")]
pub fn quantize_nearest_avx2(x: &[f32], inv: f32, out: &mut [u8]) {
    let invv = _mm256_set1_ps(inv);
    let qmin = _mm256_set1_epi16(-32767);
    let body = x.len() / 16 * 16;
    let mut i = 0;
    while i < body {
        // SAFETY: i + 16 <= x.len().
        let (a, b) = unsafe {
            (
                _mm256_loadu_ps(x.as_ptr().add(i)),
                _mm256_loadu_ps(x.as_ptr().add(i + 8)),
            )
        };
        // cvtps rounds with MXCSR, which Rust guarantees is the default
        // round-to-nearest-even: the same as round_ties_even. |x * inv| <=
        // 32767 * (1 + 2^-22) so the int32 is exact and in range; packs
        // saturates to [-32768, 32767] and the max makes it [-32767, 32767],
        // which equals clamping before rounding.
        let ia = _mm256_cvtps_epi32(_mm256_mul_ps(a, invv));
        let ib = _mm256_cvtps_epi32(_mm256_mul_ps(b, invv));
        let packed = _mm256_max_epi16(_mm256_packs_epi32(ia, ib), qmin);
        let ordered = _mm256_permute4x64_epi64::<0b11_01_10_00>(packed);
        debug_assert!(out.len() >= 2 * i + 32);
        // SAFETY: 2 * (i + 16) <= out.len(); storeu is unaligned.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(2 * i) as *mut __m256i, ordered) };
        i += 16;
    }
    scalar::quantize_nearest(&x[body..], inv, &mut out[2 * body..]);
}

/// `dither` of 8 elements from their 32-bit Weyl values `h`: offsets in
/// [0, 1).
#[target_feature(enable = "avx2")]
fn dither_values_avx2(h: __m256i) -> __m256 {
    // h >> 8 < 2^24: the int -> float conversion and the scaling are exact.
    _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_srli_epi32::<8>(h)),
        _mm256_set1_ps(TWO_POW_M24),
    )
}

#[target_feature(enable = "avx2")]
pub fn quantize_stochastic_avx2(x: &[f32], inv: f32, seed: u32, out: &mut [u8]) {
    let invv = _mm256_set1_ps(inv);
    // The Weyl values of elements i..i+8 and i+8..i+16, advanced by 16
    // golden-ratio steps per round: one add each, no multiply.
    let mut ha = _mm256_add_epi32(
        _mm256_set1_epi32(super::dither_start(seed) as i32),
        _mm256_mullo_epi32(
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            _mm256_set1_epi32(GOLDEN),
        ),
    );
    let mut hb = _mm256_add_epi32(ha, _mm256_set1_epi32(GOLDEN.wrapping_mul(8)));
    let round_step = _mm256_set1_epi32(GOLDEN.wrapping_mul(16));
    let body = x.len() / 16 * 16;
    let mut i = 0;
    while i < body {
        // SAFETY: i + 16 <= x.len().
        let (a, b) = unsafe {
            (
                _mm256_loadu_ps(x.as_ptr().add(i)),
                _mm256_loadu_ps(x.as_ptr().add(i + 8)),
            )
        };
        let ta = _mm256_add_ps(_mm256_mul_ps(a, invv), dither_values_avx2(ha));
        let tb = _mm256_add_ps(_mm256_mul_ps(b, invv), dither_values_avx2(hb));
        let qa = clamp_q_avx2(_mm256_round_ps::<
            { _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC },
        >(ta));
        let qb = clamp_q_avx2(_mm256_round_ps::<
            { _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC },
        >(tb));
        store_i16x16(out, i, qa, qb);
        ha = _mm256_add_epi32(ha, round_step);
        hb = _mm256_add_epi32(hb, round_step);
        i += 16;
    }
    // The tail keeps its element indices so that the dither matches.
    for j in body..x.len() {
        let t = x[j] * inv;
        let qv = super::clamp_q((t + super::dither(seed, j as u32)).floor()) as i16;
        out[2 * j..2 * j + 2].copy_from_slice(&qv.to_le_bytes());
    }
}

#[target_feature(enable = "avx2")]
fn load_q8_avx2(payload: &[u8], at: usize) -> __m256 {
    // SAFETY: callers guarantee 2 * (at + 8) <= payload.len(); loadu is unaligned.
    let raw = unsafe { _mm_loadu_si128(payload.as_ptr().add(2 * at) as *const __m128i) };
    _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(raw))
}

#[target_feature(enable = "avx2")]
pub fn dequantize_avx2(payload: &[u8], scale: f32, out: &mut [f32]) {
    let s = _mm256_set1_ps(scale);
    let n = out.len();
    let body = n / 8 * 8;
    let mut i = 0;
    while i < body {
        let v = _mm256_mul_ps(load_q8_avx2(payload, i), s);
        // SAFETY: i + 8 <= out.len().
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(i), v) };
        i += 8;
    }
    scalar::dequantize(&payload[2 * body..], scale, &mut out[body..]);
}

#[target_feature(enable = "avx2")]
pub fn accumulate_avx2(acc: &mut [f32], payload: &[u8], scale: f32, bound: f32) {
    let s = _mm256_set1_ps(scale);
    let hi = _mm256_set1_ps(bound);
    let lo = _mm256_set1_ps(-bound);
    let n = acc.len();
    let body = n / 8 * 8;
    let mut i = 0;
    while i < body {
        let v = _mm256_mul_ps(load_q8_avx2(payload, i), s);
        let v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
        // SAFETY: i + 8 <= acc.len(); unaligned load/store.
        unsafe {
            let a = _mm256_loadu_ps(acc.as_ptr().add(i));
            _mm256_storeu_ps(acc.as_mut_ptr().add(i), _mm256_add_ps(a, v));
        }
        i += 8;
    }
    scalar::accumulate(&mut acc[body..], &payload[2 * body..], scale, bound);
}

#[target_feature(enable = "avx2")]
pub fn accumulate_absmax_avx2(
    acc: &mut [f32],
    payload: &[u8],
    scale: f32,
    bound: f32,
) -> Option<f32> {
    // Without a clip policy the bound is infinite and clamping to it
    // changes no value (q * scale is never NaN): skip the two instructions.
    if bound == f32::INFINITY {
        accumulate_absmax_avx2_impl::<false>(acc, payload, scale, bound)
    } else {
        accumulate_absmax_avx2_impl::<true>(acc, payload, scale, bound)
    }
}

#[target_feature(enable = "avx2")]
fn accumulate_absmax_avx2_impl<const CLAMP: bool>(
    acc: &mut [f32],
    payload: &[u8],
    scale: f32,
    bound: f32,
) -> Option<f32> {
    let s = _mm256_set1_ps(scale);
    let hi = _mm256_set1_ps(bound);
    let lo = _mm256_set1_ps(-bound);
    let abs_mask = _mm256_set1_epi32(0x7fff_ffff);
    // The max is taken over the bits of |r| as integers: for non-negative
    // floats that order is the float order, and infinities and NaNs (bits
    // above f32::MAX's) win it, so one instruction both finds the absmax
    // and flags a non-finite sum. Two chains hide the max latency.
    let mut m = [_mm256_setzero_si256(); 2];
    let body = acc.len() / 16 * 16;
    let mut i = 0;
    while i < body {
        for (k, mk) in m.iter_mut().enumerate() {
            let at = i + 8 * k;
            let mut v = _mm256_mul_ps(load_q8_avx2(payload, at), s);
            if CLAMP {
                v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
            }
            // SAFETY: at + 8 <= acc.len(); unaligned load/store.
            let r = unsafe {
                let r = _mm256_add_ps(_mm256_loadu_ps(acc.as_ptr().add(at)), v);
                _mm256_storeu_ps(acc.as_mut_ptr().add(at), r);
                r
            };
            *mk = _mm256_max_epi32(*mk, _mm256_and_si256(_mm256_castps_si256(r), abs_mask));
        }
        i += 16;
    }
    let tail = scalar::accumulate_absmax(&mut acc[body..], &payload[2 * body..], scale, bound);
    let mut lanes = [0i32; 8];
    // SAFETY: lanes holds 8 i32; storeu is unaligned.
    unsafe {
        _mm256_storeu_si256(
            lanes.as_mut_ptr() as *mut __m256i,
            _mm256_max_epi32(m[0], m[1]),
        )
    };
    let body_max = f32::from_bits(lanes.into_iter().max().unwrap_or(0) as u32);
    if !body_max.is_finite() {
        return None;
    }
    let tail = tail?;
    Some(if body_max > tail { body_max } else { tail })
}

// ------------------------------------------------------------- AVX-512F

#[target_feature(enable = "avx512f")]
pub fn absmax_avx512(x: &[f32]) -> (f32, Option<usize>) {
    let max_finite = _mm512_set1_ps(f32::MAX);
    let mut m = [_mm512_setzero_ps(); 4];
    let mut bad: __mmask16 = 0;
    let body = x.len() / 64 * 64;
    let mut i = 0;
    while i < body {
        for (k, mk) in m.iter_mut().enumerate() {
            // SAFETY: i + 64 <= x.len(); loadu is unaligned.
            let v = unsafe { _mm512_loadu_ps(x.as_ptr().add(i + 16 * k)) };
            let a = _mm512_abs_ps(v);
            bad |= _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(a, max_finite);
            *mk = _mm512_max_ps(*mk, a);
        }
        i += 64;
    }
    if bad != 0 {
        return scalar::absmax(x);
    }
    let (tail, bad_tail) = scalar::absmax(&x[body..]);
    if let Some(j) = bad_tail {
        return (0.0, Some(body + j));
    }
    let v = _mm512_reduce_max_ps(_mm512_max_ps(
        _mm512_max_ps(m[0], m[1]),
        _mm512_max_ps(m[2], m[3]),
    ));
    (if v > tail { v } else { tail }, None)
}

#[target_feature(enable = "avx512f")]
fn store_q16_avx512(out: &mut [u8], at: usize, v: __m512) {
    let v = _mm512_max_ps(
        _mm512_min_ps(v, _mm512_set1_ps(QMAX)),
        _mm512_set1_ps(-QMAX),
    );
    // In range after the clamp: the truncating narrow is exact.
    let q = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(v));
    // SAFETY: callers guarantee 2 * (at + 16) <= out.len(); storeu is unaligned.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(2 * at) as *mut __m256i, q) };
}

#[target_feature(enable = "avx512f")]
pub fn quantize_nearest_avx512(x: &[f32], inv: f32, out: &mut [u8]) {
    let invv = _mm512_set1_ps(inv);
    let body = x.len() / 16 * 16;
    let mut i = 0;
    while i < body {
        // SAFETY: i + 16 <= x.len().
        let v = unsafe { _mm512_loadu_ps(x.as_ptr().add(i)) };
        // imm 0x08: round to nearest even, exceptions suppressed.
        store_q16_avx512(out, i, _mm512_roundscale_ps::<0x08>(_mm512_mul_ps(v, invv)));
        i += 16;
    }
    scalar::quantize_nearest(&x[body..], inv, &mut out[2 * body..]);
}

#[target_feature(enable = "avx512f")]
pub fn quantize_stochastic_avx512(x: &[f32], inv: f32, seed: u32, out: &mut [u8]) {
    let invv = _mm512_set1_ps(inv);
    let start = super::dither_start(seed);
    let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let steps = _mm512_mullo_epi32(lane, _mm512_set1_epi32(GOLDEN));
    let body = x.len() / 16 * 16;
    let mut i = 0;
    while i < body {
        let base = start.wrapping_add((i as u32).wrapping_mul(super::GOLDEN));
        let h = _mm512_add_epi32(_mm512_set1_epi32(base as i32), steps);
        let u = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_srli_epi32::<8>(h)),
            _mm512_set1_ps(TWO_POW_M24),
        );
        // SAFETY: i + 16 <= x.len().
        let v = unsafe { _mm512_loadu_ps(x.as_ptr().add(i)) };
        let t = _mm512_add_ps(_mm512_mul_ps(v, invv), u);
        // imm 0x09: round toward -inf (floor), exceptions suppressed.
        store_q16_avx512(out, i, _mm512_roundscale_ps::<0x09>(t));
        i += 16;
    }
    for j in body..x.len() {
        let t = x[j] * inv;
        let qv = super::clamp_q((t + super::dither(seed, j as u32)).floor()) as i16;
        out[2 * j..2 * j + 2].copy_from_slice(&qv.to_le_bytes());
    }
}

#[target_feature(enable = "avx512f")]
fn load_q16_avx512(payload: &[u8], at: usize) -> __m512 {
    // SAFETY: callers guarantee 2 * (at + 16) <= payload.len(); loadu is unaligned.
    let raw = unsafe { _mm256_loadu_si256(payload.as_ptr().add(2 * at) as *const __m256i) };
    _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(raw))
}

#[target_feature(enable = "avx512f")]
pub fn dequantize_avx512(payload: &[u8], scale: f32, out: &mut [f32]) {
    let s = _mm512_set1_ps(scale);
    let body = out.len() / 16 * 16;
    let mut i = 0;
    while i < body {
        let v = _mm512_mul_ps(load_q16_avx512(payload, i), s);
        // SAFETY: i + 16 <= out.len().
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(i), v) };
        i += 16;
    }
    scalar::dequantize(&payload[2 * body..], scale, &mut out[body..]);
}

#[target_feature(enable = "avx512f")]
pub fn accumulate_avx512(acc: &mut [f32], payload: &[u8], scale: f32, bound: f32) {
    let s = _mm512_set1_ps(scale);
    let hi = _mm512_set1_ps(bound);
    let lo = _mm512_set1_ps(-bound);
    let body = acc.len() / 16 * 16;
    let mut i = 0;
    while i < body {
        let v = _mm512_mul_ps(load_q16_avx512(payload, i), s);
        let v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        // SAFETY: i + 16 <= acc.len(); unaligned load/store.
        unsafe {
            let a = _mm512_loadu_ps(acc.as_ptr().add(i));
            _mm512_storeu_ps(acc.as_mut_ptr().add(i), _mm512_add_ps(a, v));
        }
        i += 16;
    }
    scalar::accumulate(&mut acc[body..], &payload[2 * body..], scale, bound);
}

#[target_feature(enable = "avx512f")]
pub fn accumulate_absmax_avx512(
    acc: &mut [f32],
    payload: &[u8],
    scale: f32,
    bound: f32,
) -> Option<f32> {
    let s = _mm512_set1_ps(scale);
    let hi = _mm512_set1_ps(bound);
    let lo = _mm512_set1_ps(-bound);
    let clamp = bound != f32::INFINITY;
    // An integer max over the bits of |r|, as in the AVX2 kernel.
    let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
    let mut m = [_mm512_setzero_si512(); 2];
    let body = acc.len() / 32 * 32;
    let mut i = 0;
    while i < body {
        for (k, mk) in m.iter_mut().enumerate() {
            let at = i + 16 * k;
            let mut v = _mm512_mul_ps(load_q16_avx512(payload, at), s);
            if clamp {
                v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
            }
            // SAFETY: at + 16 <= acc.len(); unaligned load/store.
            let r = unsafe {
                let r = _mm512_add_ps(_mm512_loadu_ps(acc.as_ptr().add(at)), v);
                _mm512_storeu_ps(acc.as_mut_ptr().add(at), r);
                r
            };
            *mk = _mm512_max_epi32(*mk, _mm512_and_si512(_mm512_castps_si512(r), abs_mask));
        }
        i += 32;
    }
    let tail = scalar::accumulate_absmax(&mut acc[body..], &payload[2 * body..], scale, bound);
    let body_max = f32::from_bits(_mm512_reduce_max_epi32(_mm512_max_epi32(m[0], m[1])) as u32);
    if !body_max.is_finite() {
        return None;
    }
    let tail = tail?;
    Some(if body_max > tail { body_max } else { tail })
}
