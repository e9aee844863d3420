//! The i16 codec against its spec, and every SIMD path against the scalar
//! reference, bit for bit.

use collectives::codec::{chunk_scale, dither, fmix32, Combine, Isa};
use collectives::{Error, Rounding};

fn data(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            match i % 11 {
                // Exact ties in quantized units and signed zeros.
                3 => (((s >> 50) as f32) + 0.5) / 32767.0 * scale,
                7 => -0.0,
                _ => ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale,
            }
        })
        .collect()
}

#[test]
fn fmix32_and_dither_match_reference_values() {
    // MurmurHash3 fmix32 reference values (independent implementation).
    assert_eq!(fmix32(0), 0);
    assert_eq!(fmix32(1), 0x514e_28b7);
    assert_eq!(fmix32(0xdead_beef), 0x0de5_c6a9);
    // u_i = ((fmix32(seed) + i * 0x9E3779B9) mod 2^32 >> 8) * 2^-24:
    // compare the exact 24-bit numerators.
    assert_eq!(dither(42, 0) * 16_777_216.0, 557_005.0);
    assert_eq!(dither(42, 3) * 16_777_216.0, 14_886_458.0);
    // One golden-ratio step apart, wrapping: 2^32 / phi ~ 0.618 of the circle.
    let step = dither(7, 1) - dither(7, 0);
    assert!((step.rem_euclid(1.0) - 0.618).abs() < 1e-3, "{step}");
}

#[test]
fn nearest_follows_the_spec() {
    let isa = Isa::scalar();
    let mut out = [0u8; 8];
    let x = [1.0f32, -0.5, 0.25, 0.0];
    let scale = isa.quantize(&x, Rounding::Nearest, 0, &mut out).unwrap();
    assert_eq!(scale, 1.0f32 / 32767.0);
    let q: Vec<i16> = out
        .chunks(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect();
    // -16383.5 rounds to even (-16384); 8191.75 to 8192.
    assert_eq!(q, vec![32767, -16384, 8192, 0]);
}

#[test]
fn zero_and_non_finite_chunks() {
    let isa = Isa::best();
    let mut out = [0xffu8; 6];
    assert_eq!(
        isa.quantize(&[0.0, -0.0, 0.0], Rounding::Nearest, 0, &mut out)
            .unwrap(),
        0.0
    );
    assert_eq!(out, [0; 6]);
    for isa in Isa::available() {
        let mut x = data(100, 5, 1.0);
        x[61] = f32::NAN;
        let mut out = vec![0u8; 200];
        assert!(matches!(
            isa.quantize(&x, Rounding::Nearest, 0, &mut out),
            Err(Error::NonFinite { index: 61, .. })
        ));
        x[61] = 1.0;
        x[99] = f32::NEG_INFINITY;
        assert!(matches!(
            isa.quantize(&x, Rounding::Stochastic, 0, &mut out),
            Err(Error::NonFinite { index: 99, .. })
        ));
    }
    // Tiny absmax whose inverse overflows: flushed to zero.
    assert_eq!(chunk_scale(1e-40), (0.0, 0.0));
    assert_eq!(chunk_scale(0.0), (0.0, 0.0));
}

#[test]
fn simd_paths_are_bit_identical_to_scalar() {
    let isas = Isa::available();
    println!(
        "instruction sets: {:?}",
        isas.iter().map(|i| i.name()).collect::<Vec<_>>()
    );
    let scalar = Isa::scalar();
    let lens = (0..70).chain([127, 128, 129, 1000, 4099, 65535]);
    for (k, n) in lens.enumerate() {
        for mag in [1.0f32, 3.7e-20, 6.1e18] {
            let x = data(n, k as u64 + 1, mag);
            for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                let seed = 0x1234_5678 ^ k as u32;
                // Outputs start with different junk: quantize must write
                // every byte (the engine encodes into reused buffers).
                let mut want = vec![0xa5u8; 2 * n];
                let ws = scalar.quantize(&x, rounding, seed, &mut want).unwrap();
                let mut acc0: Vec<f32> = data(n, 99, 2.0);
                let mut deq_want = vec![0f32; n];
                scalar.dequantize(&want, ws, &mut deq_want);
                for bound in [f32::INFINITY, 0.3 * mag] {
                    let mut acc_want = acc0.clone();
                    scalar.accumulate(&mut acc_want, &want, ws, bound);
                    for &isa in &isas {
                        let mut got = vec![0x5au8; 2 * n];
                        let gs = isa.quantize(&x, rounding, seed, &mut got).unwrap();
                        assert_eq!(gs.to_bits(), ws.to_bits(), "{} scale n={n}", isa.name());
                        assert_eq!(got, want, "{} {rounding:?} n={n} mag={mag}", isa.name());
                        let mut deq = vec![0f32; n];
                        isa.dequantize(&got, gs, &mut deq);
                        assert!(
                            deq.iter()
                                .zip(&deq_want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{} dequantize n={n}",
                            isa.name()
                        );
                        let mut acc = acc0.clone();
                        isa.accumulate(&mut acc, &got, gs, bound);
                        assert!(
                            acc.iter()
                                .zip(&acc_want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{} accumulate n={n}",
                            isa.name()
                        );
                    }
                }
                acc0.clear();
            }
        }
    }
}

#[test]
fn quantization_error_within_documented_factor() {
    for (rounding, factor) in [(Rounding::Nearest, 0.51f64), (Rounding::Stochastic, 1.01)] {
        for k in 0..20u64 {
            let x = data(5000, k + 7, 10f32.powi(k as i32 - 10));
            let mut q = vec![0u8; 10000];
            let s = Isa::best()
                .quantize(&x, rounding, k as u32, &mut q)
                .unwrap();
            let mut y = vec![0f32; 5000];
            Isa::best().dequantize(&q, s, &mut y);
            for (a, b) in x.iter().zip(&y) {
                assert!(
                    ((*a as f64) - (*b as f64)).abs() <= factor * s as f64,
                    "{rounding:?}: {a} vs {b}, scale {s}"
                );
            }
        }
    }
}

#[test]
fn stochastic_rounding_is_unbiased() {
    // Average the dequantized value of one fixed input over many seeds.
    let x: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut mean = vec![0f64; 256];
    let (mut q, mut y) = (vec![0u8; 512], vec![0f32; 256]);
    let trials = 4000;
    let mut s = 0.0;
    for seed in 0..trials {
        s = Isa::best()
            .quantize(&x, Rounding::Stochastic, seed, &mut q)
            .unwrap();
        Isa::best().dequantize(&q, s, &mut y);
        for (m, v) in mean.iter_mut().zip(&y) {
            *m += *v as f64 / trials as f64;
        }
    }
    for (m, v) in mean.iter().zip(&x) {
        // Standard error of the mean is <= 0.5 s / sqrt(trials).
        assert!(
            (m - *v as f64).abs() < 5.0 * 0.5 * s as f64 / (trials as f64).sqrt(),
            "{m} vs {v}"
        );
    }
}

#[test]
fn combine_max_min_and_clamp() {
    let isa = Isa::best();
    let mut q = vec![0u8; 8];
    let s = isa
        .quantize(&[4.0, -4.0, 1.0, -1.0], Rounding::Nearest, 0, &mut q)
        .unwrap();
    let mut acc = vec![0.5f32, 0.5, 0.5, 0.5];
    Combine::Max.i16_into(isa, &mut acc, &q, s, f32::INFINITY);
    assert_eq!(acc[0], 4.0);
    assert_eq!(acc[1], 0.5);
    let mut acc = vec![0.0f32; 4];
    Combine::Sum.i16_into(isa, &mut acc, &q, s, 2.0);
    assert_eq!(acc[0], 2.0);
    assert_eq!(acc[1], -2.0);
}

#[test]
fn simd_rounds_exact_ties_to_even() {
    // absmax 32767 makes inv == 1, so k + 0.5 are exact ties.
    let mut x = vec![32767.0f32];
    x.extend((0..40).map(|k| (k as f32 - 20.0) + 0.5));
    let want: Vec<i16> = x.iter().map(|v| v.round_ties_even() as i16).collect();
    for isa in Isa::available() {
        let mut q = vec![0u8; 2 * x.len()];
        isa.quantize(&x, Rounding::Nearest, 0, &mut q).unwrap();
        let got: Vec<i16> = q
            .chunks(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(got, want, "{}", isa.name());
    }
}

/// The fused hop kernels (fold a chunk, measure its absmax in the same
/// pass, quantize with that absmax) give exactly what the separate kernels
/// give, on every instruction set, for lengths around every vector width.
#[test]
fn fused_accumulate_absmax_then_quantize_matches_the_separate_kernels() {
    let scalar = Isa::scalar();
    let lens = (0..70).chain([127, 128, 129, 1000, 4099, 16384]);
    for (k, n) in lens.enumerate() {
        for mag in [1.0f32, 3.7e-20, 6.1e18] {
            let x = data(n, k as u64 + 7, mag);
            let mut payload = vec![0u8; 2 * n];
            let scale = scalar
                .quantize(&x, Rounding::Nearest, 1, &mut payload)
                .unwrap();
            for bound in [f32::INFINITY, 0.3 * mag] {
                let acc0 = data(n, k as u64 + 99, mag);
                let mut acc_want = acc0.clone();
                scalar.accumulate(&mut acc_want, &payload, scale, bound);
                let absmax_want = scalar.absmax(&acc_want).unwrap();
                for isa in Isa::available() {
                    let mut acc = acc0.clone();
                    let absmax = isa.accumulate_absmax(&mut acc, &payload, scale, bound);
                    assert!(
                        acc.iter()
                            .zip(&acc_want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{} accumulate_absmax values n={n}",
                        isa.name()
                    );
                    assert_eq!(
                        absmax.map(f32::to_bits),
                        Some(absmax_want.to_bits()),
                        "{} absmax n={n} mag={mag}",
                        isa.name()
                    );
                    for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                        let mut want = vec![0u8; 2 * n];
                        let ws = isa.quantize(&acc, rounding, 5, &mut want).unwrap();
                        let mut got = vec![0u8; 2 * n];
                        let gs = isa
                            .quantize_with_absmax(&acc, absmax.unwrap(), rounding, 5, &mut got)
                            .unwrap();
                        assert_eq!((gs.to_bits(), &got), (ws.to_bits(), &want));
                    }
                }
            }
        }
    }
}

/// A fold that overflows reports no absmax (the caller then lets
/// `quantize` find and name the bad element) but still folds every element.
#[test]
fn fused_accumulate_absmax_reports_overflow_and_still_folds_everything() {
    let n = 100;
    let mut payload = vec![0u8; 2 * n];
    let scale = Isa::scalar()
        .quantize(&vec![1.0f32; n], Rounding::Nearest, 0, &mut payload)
        .unwrap();
    for at in [0, 17, 63, 99] {
        for isa in Isa::available() {
            let mut acc = vec![0.5f32; n];
            acc[at] = f32::MAX;
            let big = scale * 1e38;
            let absmax = isa.accumulate_absmax(&mut acc, &payload, big, f32::INFINITY);
            assert_eq!(absmax, None, "{} overflow at {at}", isa.name());
            assert!(acc[at].is_infinite());
            let finite: Vec<_> = (0..n).filter(|&i| i != at).collect();
            assert!(
                finite.iter().all(|&i| acc[i] == 0.5 + 32767.0 * big),
                "{} every other element folded",
                isa.name()
            );
            let err = isa.quantize(&acc, Rounding::Nearest, 0, &mut payload.clone());
            assert!(err.is_err());
        }
    }
}
