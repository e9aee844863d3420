//! Every op x every algorithm x both codecs, world sizes 1..=8, sizes from
//! one element to ~40k (primes included), against an f64 reference.

mod common;

use collectives::sim::SimConfig;
use collectives::{Algo, Codec, Rounding};
use common::*;

const SIZES: [usize; 8] = [1, 2, 3, 13, 127, 1031, 8191, 40009];

fn matrix(algo: Algo, codec: Codec) {
    for world in 1..=8 {
        run_matrix(
            algo,
            codec,
            world,
            &all_ops(),
            &SIZES,
            1000,
            SimConfig::default(),
        );
    }
}

#[test]
fn ring_f32() {
    matrix(Algo::Ring, Codec::F32);
}
#[test]
fn ring_i16() {
    matrix(Algo::Ring, Codec::I16(Rounding::Nearest));
}
#[test]
fn direct_f32() {
    matrix(Algo::Direct, Codec::F32);
}
#[test]
fn direct_i16() {
    matrix(Algo::Direct, Codec::I16(Rounding::Nearest));
}
#[test]
fn rd_f32() {
    matrix(Algo::RecursiveDoubling, Codec::F32);
}
#[test]
fn rd_i16() {
    matrix(Algo::RecursiveDoubling, Codec::I16(Rounding::Nearest));
}
#[test]
fn auto_both_codecs() {
    matrix(Algo::Auto, Codec::F32);
    matrix(Algo::Auto, Codec::I16(Rounding::Nearest));
}
#[test]
fn stochastic_rounding_all_algorithms() {
    for algo in ALGOS {
        for world in [2, 3, 5, 8] {
            run_matrix(
                algo,
                Codec::I16(Rounding::Stochastic),
                world,
                &all_ops(),
                &[1, 127, 8191],
                1000,
                SimConfig::default(),
            );
        }
    }
}
#[test]
fn default_chunk_size_large_buffers() {
    // 64 KiB chunks, ~1 MB buffers, odd world.
    for algo in ALGOS {
        for codec in [Codec::F32, Codec::I16(Rounding::Nearest)] {
            run_matrix(
                algo,
                codec,
                5,
                // Every op but the barrier (no buffer to check).
                &all_ops()[..10],
                &[262_147],
                16 * 1024,
                SimConfig::default(),
            );
        }
    }
}

/// `Algo::Auto` (crate docs): recursive doubling up to `small_bytes` of
/// f32 input (64 KiB by default) and for barriers, the ring above, at
/// every world size; a configured `small_bytes` moves the threshold.
#[test]
fn auto_picks_recursive_doubling_up_to_64_kib_and_the_ring_above() {
    use collectives::{AlgoId, Config, Engine, Op, ReduceOp};
    let at_threshold = 64 * 1024 / 4;
    for world in [2, 3, 8] {
        let e = Engine::new(0, world, Config::default()).unwrap();
        for op in [
            Op::AllReduce(ReduceOp::Sum),
            Op::ReduceScatter(ReduceOp::Max),
            Op::AllGather,
        ] {
            assert_eq!(e.algo_for(op, 1).unwrap(), AlgoId::RecursiveDoubling);
            assert_eq!(
                e.algo_for(op, at_threshold).unwrap(),
                AlgoId::RecursiveDoubling,
                "{op:?} at 64 KiB, world {world}"
            );
            assert_eq!(
                e.algo_for(op, at_threshold + 1).unwrap(),
                AlgoId::Ring,
                "{op:?} above 64 KiB, world {world}"
            );
        }
        assert_eq!(
            e.algo_for(Op::Barrier, 1 << 20).unwrap(),
            AlgoId::RecursiveDoubling
        );
    }
    let small = Config {
        small_bytes: 4096,
        ..Config::default()
    };
    let e = Engine::new(0, 4, small).unwrap();
    let sum = Op::AllReduce(ReduceOp::Sum);
    assert_eq!(e.algo_for(sum, 1024).unwrap(), AlgoId::RecursiveDoubling);
    assert_eq!(e.algo_for(sum, 1025).unwrap(), AlgoId::Ring);
}
