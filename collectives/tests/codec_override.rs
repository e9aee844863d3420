//! `Collective::with_codec`: one collective runs with another codec than
//! the communicator's, so values that must stay exact (a count, a loss)
//! go through a job whose gradients travel as clipped i16.

mod common;

use collectives::sim::{Job, Sim, SimConfig};
use collectives::{Codec, Collective, Engine, ReduceOp, Rounding};
use common::*;

const WORLD: usize = 5;
const N: usize = 1000;
const CLIP: f32 = 0.5;

/// Integers up to 4095 (the perf tool's base-4096 digits): their sums are
/// exact in f32, and none survives a clip at 0.5 or i16's 1/32767 steps
/// of the absmax unchanged.
fn counts(rank: usize) -> Vec<f32> {
    (0..N)
        .map(|i| ((i * 37 + rank * 1013) % 4096) as f32)
        .collect()
}

/// All-reduce(sum) of `counts` on every rank of an i16 + clip communicator,
/// with `collective` (which may override the codec).
fn all_reduce(algo: collectives::Algo, collective: Collective) -> Vec<Vec<f32>> {
    let mut config = engine_config(algo, Codec::I16(Rounding::Nearest), 256);
    config.clip = Some(CLIP);
    let mut sim = Sim::new(WORLD, config, SimConfig::default()).unwrap();
    let mut jobs = vec![Job::new(collective, (0..WORLD).map(counts).collect())];
    sim.run(&mut jobs).unwrap();
    jobs.remove(0).bufs
}

#[test]
fn a_collective_with_the_f32_codec_is_exact_in_an_i16_job_with_a_clip() {
    let want: Vec<f32> = (0..N)
        .map(|i| (0..WORLD).map(|r| counts(r)[i]).sum())
        .collect();
    for algo in ALGOS {
        let exact = Collective::all_reduce(ReduceOp::Sum).with_codec(Codec::F32);
        for (rank, got) in all_reduce(algo, exact).iter().enumerate() {
            assert_eq!(got, &want, "{algo:?}, rank {rank}: with_codec(F32)");
        }
        // The same collective with the communicator's codec is clipped:
        // what the override is for.
        let clipped = all_reduce(algo, Collective::all_reduce(ReduceOp::Sum));
        let worst = clipped[0].iter().fold(0f32, |m, &x| m.max(x.abs()));
        assert!(
            worst <= CLIP * WORLD as f32 * 1.01,
            "{algo:?}: without the override every contribution is clipped to {CLIP}, got {worst}"
        );
    }
}

#[test]
fn ranks_that_disagree_on_the_codec_of_a_collective_get_an_error_not_a_result() {
    let config = engine_config(collectives::Algo::Ring, Codec::I16(Rounding::Nearest), 256);
    let mut engines: Vec<Engine> = (0..2)
        .map(|r| Engine::new(r, 2, config.clone()).unwrap())
        .collect();
    let mut bufs: Vec<Vec<f32>> = (0..2).map(counts).collect();
    let sum = Collective::all_reduce(ReduceOp::Sum);
    engines[0]
        .start(sum.with_codec(Codec::F32), &mut bufs[0])
        .unwrap();
    engines[1].start(sum, &mut bufs[1]).unwrap();
    let out = engines[0]
        .poll_send()
        .expect("rank 0 sends its first chunk");
    assert_eq!(out.to, 1);
    let err = engines[1]
        .handle(0, &out.bytes, &mut bufs[1])
        .expect_err("rank 1 runs the collective as i16");
    assert!(
        err.to_string().contains("codec differs"),
        "unexpected error: {err}"
    );
}
