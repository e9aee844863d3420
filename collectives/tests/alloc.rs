//! The engine's steady state allocates nothing (crate docs, "Allocation"):
//! once its state and message buffers exist, a collective whose sent
//! buffers are recycled runs without one heap allocation. Counted on this
//! thread by allocation-counter, for every algorithm, op and codec.

use collectives::{Algo, Codec, Collective, Config, Engine, Progress, ReduceOp, Rounding};

const WORLD: usize = 4;
/// Several chunks per rank, a prime so that shards are uneven.
const COUNT: usize = 100_003;

/// Deliver every message until no engine has anything to send; each sent
/// buffer goes back to its engine for reuse. Returns the completions.
fn pump(engines: &mut [Engine], bufs: &mut [Vec<f32>]) -> usize {
    let mut completed = 0;
    loop {
        let mut moved = false;
        for from in 0..engines.len() {
            while let Some(out) = engines[from].poll_send() {
                let to = out.to;
                if engines[to].handle(from, &out.bytes, &mut bufs[to]).unwrap()
                    == Progress::Complete
                {
                    completed += 1;
                }
                engines[from].recycle(out.bytes);
                moved = true;
            }
        }
        if !moved {
            return completed;
        }
    }
}

/// Rank `r`'s input at `i`: multiples of 1/4, exact in f32.
fn input(r: usize, i: usize) -> f32 {
    ((i * 7 + r * 13) % 64) as f32 * 0.25 - 8.0
}

/// One collective on every rank, inputs refilled in place.
fn run(engines: &mut [Engine], bufs: &mut [Vec<f32>], collective: Collective) {
    let mut completed = 0;
    for (r, (e, b)) in engines.iter_mut().zip(bufs.iter_mut()).enumerate() {
        for (i, x) in b.iter_mut().enumerate() {
            *x = input(r, i);
        }
        if e.start(collective, b).unwrap() == Progress::Complete {
            completed += 1;
        }
    }
    completed += pump(engines, bufs);
    assert_eq!(completed, engines.len(), "every rank completes");
}

#[test]
fn a_steady_state_collective_allocates_nothing() {
    let ops = [
        Collective::all_reduce(ReduceOp::Sum),
        Collective::reduce_scatter(ReduceOp::Max),
        Collective::all_gather(),
        Collective::broadcast(1),
    ];
    for algo in [Algo::Ring, Algo::Direct, Algo::RecursiveDoubling] {
        for codec in [Codec::F32, Codec::I16(Rounding::Nearest)] {
            for op in ops {
                let config = Config {
                    algo,
                    codec,
                    ..Config::default()
                };
                let mut engines: Vec<Engine> = (0..WORLD)
                    .map(|r| Engine::new(r, WORLD, config.clone()).unwrap())
                    .collect();
                let mut bufs = vec![vec![0f32; COUNT]; WORLD];
                let op = match (codec, op.op) {
                    (Codec::I16(_), collectives::Op::AllReduce(_)) => op.with_feedback(7),
                    _ => op,
                };
                // Warm-up: state, staging, residuals, and message buffers
                // that grow until each fits every message (three suffice).
                for _ in 0..3 {
                    run(&mut engines, &mut bufs, op);
                }
                for round in 0..3 {
                    let info = allocation_counter::measure(|| {
                        run(&mut engines, &mut bufs, op);
                    });
                    assert_eq!(
                        info.count_total, 0,
                        "{algo:?} {codec:?} {:?} round {round}: {} allocations, {} bytes",
                        op.op, info.count_total, info.bytes_total
                    );
                }
                if let collectives::Op::AllReduce(_) = op.op {
                    // Still right: the sum of every rank's input.
                    let want = |i: usize| -> f32 { (0..WORLD).map(|r| input(r, i)).sum() };
                    let tolerance = if codec == Codec::F32 { 0.0 } else { 0.01 };
                    for i in [0, 1, COUNT / 2, COUNT - 1] {
                        let got = bufs[0][i];
                        assert!(
                            (got - want(i)).abs() <= tolerance,
                            "{algo:?} {codec:?} [{i}] {got}"
                        );
                    }
                }
            }
        }
    }
}
