//! 64 MB all-reduces (16 Mi f32 per rank) through the simulator.

mod common;

use std::time::Instant;

use collectives::sim::{Job, Sim, SimConfig};
use collectives::{Algo, Codec, Collective, Config, Op, ReduceOp, Rounding};
use common::{run_matrix, ALGOS};

/// The largest sizes through every algorithm and both codecs: a prime
/// count just under 64 MB, an odd world, every element of every rank
/// against the f64 reference and the per-chunk i16 bound.
#[test]
fn allreduce_64_mb_prime_every_algorithm_both_codecs() {
    const N: usize = (1 << 24) - 3; // prime
    for algo in ALGOS {
        for codec in [Codec::F32, Codec::I16(Rounding::Nearest)] {
            let t = Instant::now();
            run_matrix(
                algo,
                codec,
                3,
                &[Op::AllReduce(ReduceOp::Sum)],
                &[N],
                16 * 1024,
                SimConfig::default(),
            );
            println!("{algo:?} {codec:?}: {:?}", t.elapsed());
        }
    }
}

/// The other ops and reductions at the same size (the ring, which Auto
/// picks there), both codecs: 64 MB is not only for sums.
#[test]
fn every_other_op_at_64_mb() {
    const N: usize = (1 << 24) - 3; // prime
    let ops = [
        Op::AllReduce(ReduceOp::Avg),
        Op::AllReduce(ReduceOp::Min),
        Op::ReduceScatter(ReduceOp::Max),
        Op::AllGather,
        Op::Broadcast { root: 2 },
    ];
    for codec in [Codec::F32, Codec::I16(Rounding::Nearest)] {
        let t = Instant::now();
        run_matrix(
            Algo::Ring,
            codec,
            3,
            &ops,
            &[N],
            16 * 1024,
            SimConfig::default(),
        );
        println!("{codec:?}: {:?}", t.elapsed());
    }
}

#[test]
fn allreduce_64_mib_ring() {
    let world = 4;
    let n = 16 << 20;
    let bufs: Vec<Vec<f32>> = (0..world)
        .map(|r| {
            (0..n)
                .map(|i| ((i % 1000) as f32) * 0.001 + r as f32)
                .collect()
        })
        .collect();
    let cfg = Config {
        algo: Algo::Ring,
        codec: Codec::F32,
        ..Config::default()
    };
    let mut sim = Sim::new(world, cfg, SimConfig::default()).unwrap();
    let mut jobs = vec![Job::new(Collective::all_reduce(ReduceOp::Sum), bufs)];
    let t = Instant::now();
    let report = sim.run(&mut jobs).unwrap();
    println!(
        "64 MiB x {world} ranks: {:?} wall, {} messages, {:.3} ms virtual",
        t.elapsed(),
        report.messages,
        report.time_ns as f64 / 1e6
    );
    for i in (0..n).step_by(4099).chain([n - 1]) {
        let want = 4.0 * (((i % 1000) as f32) * 0.001) as f64 + 6.0;
        let got = jobs[0].bufs[0][i] as f64;
        assert!(
            (got - want).abs() <= 1e-6 * want,
            "element {i}: {got} vs {want}"
        );
    }
    for r in 1..world {
        assert!(jobs[0].bufs[r] == jobs[0].bufs[0], "rank {r} differs");
    }
}
