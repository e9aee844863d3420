//! Error feedback: the same input all-reduced 100 times under i16; the mean
//! error over steps must shrink toward zero (bias-free), unlike without
//! feedback where nearest rounding repeats the same error every step.

mod common;

use collectives::sim::{Job, Sim, SimConfig};
use collectives::{Algo, Codec, Collective, Op, ReduceOp, Rounding};
use common::*;

fn mean_error(algo: Algo, rounding: Rounding, feedback: bool, red: ReduceOp) -> (f64, f64) {
    let world = 5;
    let n = 3000;
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, n, 11)).collect();
    let reference: Vec<f64> = (0..n)
        .map(|i| {
            let s: f64 = inputs.iter().map(|x| x[i] as f64).sum();
            if red == ReduceOp::Avg {
                s / world as f64
            } else {
                s
            }
        })
        .collect();
    let mut sim = Sim::new(
        world,
        engine_config(algo, Codec::I16(rounding), 512),
        SimConfig::default(),
    )
    .unwrap();
    let steps = 100;
    let mut err_sum = vec![0f64; n];
    let mut first_step_max = 0f64;
    for step in 0..steps {
        let mut c = Collective::new(Op::AllReduce(red));
        if feedback {
            c = c.with_feedback(42);
        }
        let mut jobs = vec![Job::new(c, inputs.clone())];
        sim.run(&mut jobs).unwrap();
        for i in 0..n {
            let e = jobs[0].bufs[0][i] as f64 - reference[i];
            err_sum[i] += e;
            if step == 0 {
                first_step_max = first_step_max.max(e.abs());
            }
        }
    }
    let mean_max = err_sum
        .iter()
        .map(|e| (e / steps as f64).abs())
        .fold(0.0, f64::max);
    (first_step_max, mean_max)
}

#[test]
fn feedback_removes_the_bias() {
    for algo in ALGOS {
        for red in [ReduceOp::Sum, ReduceOp::Avg] {
            let (single, no_fb) = mean_error(algo, Rounding::Nearest, false, red);
            let (_, fb) = mean_error(algo, Rounding::Nearest, true, red);
            println!("{algo:?} {red:?}: one step {single:.3e}, mean over 100 without feedback {no_fb:.3e}, with {fb:.3e}");
            // Without feedback the deterministic error repeats.
            assert!(
                no_fb > 0.5 * single,
                "{algo:?}: expected a persistent bias without feedback"
            );
            // With feedback the running error stays bounded: mean ~ 1/steps.
            assert!(
                fb < 0.05 * single,
                "{algo:?} {red:?}: mean error {fb:e} did not shrink (one step {single:e})"
            );
            let (_, fb_sto) = mean_error(algo, Rounding::Stochastic, true, red);
            assert!(
                fb_sto < 0.05 * single,
                "{algo:?} stochastic: mean error {fb_sto:e}"
            );
        }
    }
}

#[test]
fn a_tensor_whose_length_changes_is_refused_until_its_residual_is_cleared() {
    let world = 3;
    let mut sim = Sim::new(
        world,
        engine_config(Algo::Ring, Codec::I16(Rounding::Nearest), 64),
        SimConfig::default(),
    )
    .unwrap();
    let step = |sim: &mut Sim, n: usize| {
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, n, 5)).collect();
        let c = Collective::all_reduce(ReduceOp::Sum).with_feedback(7);
        sim.run(&mut [Job::new(c, inputs)])
    };
    step(&mut sim, 300).unwrap();
    assert_eq!(sim.engine(0).residual(7).map(<[f32]>::len), Some(300));
    let err = step(&mut sim, 200).unwrap_err();
    let collectives::Error::SimRank { source, .. } = err else {
        panic!("{err}");
    };
    assert_eq!(
        *source,
        collectives::Error::ResidualLength {
            tensor: 7,
            got: 300,
            want: 200
        }
    );
    for r in 0..world {
        sim.engine_mut(r).clear_residual(7).unwrap();
        assert!(sim.engine(r).residual(7).is_none());
    }
    step(&mut sim, 200).unwrap();
    assert_eq!(sim.engine(0).residual(7).map(<[f32]>::len), Some(200));
}

#[test]
fn residuals_and_filters_are_not_changed_under_a_running_collective() {
    let mut e =
        collectives::Engine::new(0, 2, engine_config(Algo::Direct, Codec::F32, 64)).unwrap();
    let mut buf = vec![1.0f32; 100];
    e.start(
        Collective::all_reduce(ReduceOp::Sum).with_feedback(1),
        &mut buf,
    )
    .unwrap();
    assert!(e.is_active(), "rank 1 has not answered");
    assert_eq!(e.clear_residual(1), Err(collectives::Error::Busy));
    struct Keep;
    impl collectives::ContributionFilter for Keep {
        fn inspect(&mut self, _: &collectives::ChunkInfo, _: &mut collectives::Contributions<'_>) {}
    }
    assert_eq!(e.set_filter(Box::new(Keep)), Err(collectives::Error::Busy));
}
