//! The scalar codec reference itself, checked against values worked out by
//! hand, so the GPU comparison rests on something known to be right.

mod common;

use common::reference::{self, Mode};

#[test]
fn fmix32_and_uniform_match_murmurhash3() {
    assert_eq!(reference::fmix32(0), 0);
    assert_eq!(reference::fmix32(1), 0x514e_28b7);
    let u = reference::uniform(7, 3);
    assert!((0.0..1.0).contains(&u));
    // u is a multiple of 2^-24: exact in f32.
    assert_eq!((u * 16_777_216.0).fract(), 0.0);
}

#[test]
fn nearest_rounds_half_to_even_and_scales_by_absmax() {
    // absmax 32767: scale = inv = 1, so x * inv = x and the ties are visible.
    let x = [32767.0f32, 0.5, 1.5, 2.5, -0.5, -2.5, -32767.0, 3.25];
    let mut q = [0i16; 8];
    let scales = reference::quantize(&x, None, 8, Mode::Nearest, &mut q);
    assert_eq!(scales, vec![1.0]);
    assert_eq!(q, [32767, 0, 2, 2, 0, -2, -32767, 3]);
    assert_eq!(reference::dequantize(&q, &scales, 8)[3], 2.0);
}

#[test]
fn zero_chunks_error_feedback_and_accumulate() {
    let x = [0.0f32, 0.0, 1.0, -3.0, 0.25];
    let mut r = [0.0f32, 0.0, 0.0, 0.0, 0.1];
    let mut q = [9i16; 5];
    // chunk 2: [0, 0] is all zero; [1, -3]; [0.25 + 0.1].
    let scales = reference::quantize(&x, Some(&mut r), 2, Mode::Nearest, &mut q);
    assert_eq!(scales[0], 0.0);
    assert_eq!(&q[..2], &[0, 0]);
    assert_eq!(scales[1], 3.0 / 32767.0);
    assert_eq!(q[3], -32767);
    // x' - q * scale: what the rounding lost, carried to the next round.
    assert_eq!(r[2], 1.0 - (q[2] as f32) * scales[1]);
    assert_eq!(r[4], (0.25f32 + 0.1) - 32767.0 * scales[2]);
    let mut acc = [1.0f32; 5];
    reference::accumulate(&mut acc, &q, &scales, 2);
    assert_eq!(acc[3], 1.0 + (-32767.0f32 * scales[1]));
}

#[test]
fn stochastic_rounding_is_unbiased_and_seeded() {
    let x = vec![0.3f32; 4096];
    let mut with_max = x.clone();
    with_max[0] = 32767.0; // inv = 1: q is floor(0.3 + u)
    let mut q = vec![0i16; 4096];
    reference::quantize(&with_max, None, 4096, Mode::Stochastic(42), &mut q);
    let ones = q[1..].iter().filter(|&&v| v == 1).count();
    assert!(q[1..].iter().all(|&v| v == 0 || v == 1));
    let frac = ones as f64 / 4095.0;
    assert!((frac - 0.3).abs() < 0.03, "{frac}");
    let mut q2 = vec![0i16; 4096];
    reference::quantize(&with_max, None, 4096, Mode::Stochastic(43), &mut q2);
    assert_ne!(q, q2, "the seed matters");
}
