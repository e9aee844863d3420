//! Every rank ends a collective with the same bits, including at the edges
//! the random inputs of `matrix.rs` never reach: values saturated at the
//! clip bound, NaN and signed zeros under max and min, and scales at the
//! top of the f32 range.

mod common;

use collectives::codec::Isa;
use collectives::message::{self, CodecId, Header, Kind, MAX_SCALE};
use collectives::sim::{Job, Sim, SimConfig};
use collectives::{Algo, AlgoId, Codec, Collective, Config, Error, Op, ReduceOp, Rounding};
use common::ALGOS;

fn run(
    algo: Algo,
    codec: Codec,
    clip: Option<f32>,
    op: Op,
    inputs: Vec<Vec<f32>>,
) -> Vec<Vec<f32>> {
    let cfg = Config {
        algo,
        codec,
        clip,
        chunk_elems: 7,
        ..Config::default()
    };
    let mut sim = Sim::new(inputs.len(), cfg, SimConfig::lossy(3)).unwrap();
    let mut jobs = vec![Job::new(Collective::new(op), inputs)];
    sim.run(&mut jobs)
        .unwrap_or_else(|e| panic!("{op:?} {algo:?}: {e}"));
    jobs.remove(0).bufs
}

fn assert_same_bits(out: &[Vec<f32>], what: &str) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for (r, o) in out.iter().enumerate().skip(1) {
        assert_eq!(
            bits(o),
            bits(&out[0]),
            "{what}: rank {r} differs from rank 0 ({o:?} vs {:?})",
            out[0]
        );
    }
}

/// A clip whose i16 round trip rounds up: with absmax = C, scale =
/// fl(C / 32767) and fl(32767 * scale) = 2.0 > C. The producer of a value
/// used to keep that 2.0 while its receivers clamped to C.
const CLIP: f32 = f32::from_bits(0x3FFF_FFFF);

#[test]
fn values_saturated_at_the_clip_are_the_same_on_every_rank() {
    let q = Isa::scalar();
    let mut payload = [0u8; 2];
    let scale = q
        .quantize(&[CLIP], Rounding::Nearest, 0, &mut payload)
        .unwrap();
    assert!(32767.0 * scale > CLIP, "the case this test is about");
    let ops = [
        Op::AllGather,
        Op::Broadcast { root: 1 },
        Op::AllReduce(ReduceOp::Max),
        Op::AllReduce(ReduceOp::Min),
        Op::AllReduce(ReduceOp::Avg),
        Op::ReduceScatter(ReduceOp::Max),
    ];
    for algo in ALGOS {
        for world in [2, 3, 4] {
            for op in ops {
                // Every input is beyond the clip: every value saturates.
                let inputs = vec![vec![5.0f32; 20]; world];
                let out = run(algo, Codec::I16(Rounding::Nearest), Some(CLIP), op, inputs);
                let what = format!("{op:?} {algo:?} world {world}");
                if matches!(op, Op::ReduceScatter(_)) {
                    // Each rank keeps only its shard: check the values.
                    for (r, o) in out.iter().enumerate() {
                        let shard = collectives::shard_range(20, world, r);
                        assert!(
                            o[shard].iter().all(|&v| v == CLIP),
                            "{what}: rank {r} {o:?}"
                        );
                    }
                    continue;
                }
                assert_same_bits(&out, &what);
                if op == Op::AllReduce(ReduceOp::Avg) {
                    // An average recursive doubling computes on every rank
                    // is not sent again, and may round above the clip (by
                    // an ulp here): its error is the codec's, its bits agree.
                    continue;
                }
                assert!(
                    out[0].iter().all(|&v| v == CLIP),
                    "{what}: values beyond the clip {CLIP}: {:?}",
                    out[0]
                );
            }
        }
    }
}

#[test]
fn max_and_min_agree_on_nan_and_signed_zeros_on_every_rank() {
    // Rank 0 sees the left operand and rank 1 the right one in each
    // element: NaN against a number, +0 against -0, a NaN payload
    // against another.
    let odd_nan = f32::from_bits(0x7fc0_1234);
    let a = vec![f32::NAN, 1.0, 0.0, -0.0, odd_nan, -f32::NAN];
    let b = vec![1.0, f32::NAN, -0.0, 0.0, f32::NAN, 2.0];
    for algo in ALGOS {
        for (op, zero) in [(ReduceOp::Max, 0.0f32), (ReduceOp::Min, -0.0f32)] {
            for world in [2, 3, 4] {
                let mut inputs = vec![a.clone(), b.clone()];
                inputs.resize(world, vec![-5.0f32; a.len()]);
                if op == ReduceOp::Min {
                    // The other ranks must not decide the minimum.
                    for v in inputs.iter_mut().skip(2) {
                        v.fill(5.0);
                    }
                }
                let out = run(algo, Codec::F32, None, Op::AllReduce(op), inputs);
                let what = format!("{op:?} {algo:?} world {world}");
                assert_same_bits(&out, &what);
                let got = &out[0];
                assert!(got[0].is_nan() && got[1].is_nan(), "{what}: {got:?}");
                assert!(got[4].is_nan() && got[5].is_nan(), "{what}: {got:?}");
                for v in &got[2..4] {
                    assert_eq!(v.to_bits(), zero.to_bits(), "{what}: {got:?}");
                }
            }
        }
    }
}

#[test]
fn sums_of_nans_with_different_payloads_agree_on_every_rank() {
    // x86 keeps the first operand's NaN payload, and recursive doubling
    // adds `mine + theirs` on one rank and `theirs + mine` on its
    // partner: a GPU's NaN (0x7fffffff) against x86's 0/0 (0xffc00000)
    // gave each rank its own.
    let gpu_nan = f32::from_bits(0x7fff_ffff);
    let cpu_nan = f32::from_bits(0xffc0_0000);
    let a = vec![gpu_nan, cpu_nan, f32::INFINITY, 1.0];
    let b = vec![cpu_nan, gpu_nan, f32::NEG_INFINITY, gpu_nan];
    for algo in ALGOS {
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            for world in [2, 3, 4] {
                let mut inputs = vec![a.clone(), b.clone()];
                inputs.resize(world, vec![1.0f32; a.len()]);
                let out = run(algo, Codec::F32, None, Op::AllReduce(op), inputs);
                let what = format!("{op:?} {algo:?} world {world}");
                assert_same_bits(&out, &what);
                assert!(out[0].iter().all(|v| v.is_nan()), "{what}: {:?}", out[0]);
            }
        }
    }
}

#[test]
fn the_largest_scale_a_receiver_accepts_decodes_to_finite_values() {
    assert!((32767.0 * MAX_SCALE).is_finite());
    assert!((-32767.0 * MAX_SCALE).is_finite());
    let q = Isa::scalar();
    let mut out = [0u8; 4];
    // Near the top of the range the codec still works...
    let near = f32::MAX * 0.99;
    let scale = q
        .quantize(&[near, -near], Rounding::Nearest, 0, &mut out)
        .unwrap();
    assert!(scale <= MAX_SCALE);
    let mut back = [0f32; 2];
    q.dequantize(&out, scale, &mut back);
    assert!(back.iter().all(|v| v.is_finite()), "{back:?}");
    // ...and within 2^-15 of f32::MAX it refuses rather than send a scale
    // that receivers refuse, or values that overflow.
    for isa in Isa::available() {
        let err = isa
            .quantize(&[1.0, f32::MAX], Rounding::Nearest, 0, &mut out)
            .unwrap_err();
        assert_eq!(err, Error::ScaleOverflow { absmax: f32::MAX });
    }
}

#[test]
fn a_negative_zero_scale_is_refused() {
    let header = |scale| Header {
        kind: Kind::AllReduce,
        algo: AlgoId::Ring,
        codec: CodecId::I16,
        step: 0,
        seq: 0,
        chunk: 0,
        offset: 0,
        count: 1,
        scale,
    };
    let mut bytes = Vec::new();
    message::encode(&header(-0.0), &[0, 0], &mut bytes);
    assert!(matches!(message::decode(&bytes), Err(Error::BadScale(s)) if s.is_sign_negative()));
    bytes.clear();
    message::encode(&header(0.0), &[0, 0], &mut bytes);
    assert!(message::decode(&bytes).is_ok());
}
