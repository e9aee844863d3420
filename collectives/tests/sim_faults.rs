//! Every algorithm under random loss, reordering and latency, many seeds:
//! results are bit-identical to a run on a perfect network (and correct).

mod common;

use collectives::sim::{Job, Sim, SimConfig};
use collectives::{Algo, Codec, Collective, Config, Error, Op, ReduceOp, Rounding};
use common::*;

fn jobs(world: usize, n: usize) -> (Vec<Job>, Vec<Op>) {
    let ops = vec![
        Op::AllReduce(ReduceOp::Sum),
        Op::ReduceScatter(ReduceOp::Avg),
        Op::AllGather,
        Op::Broadcast { root: world - 1 },
        Op::Barrier,
        Op::AllReduce(ReduceOp::Max),
        Op::AllReduce(ReduceOp::Sum),
    ];
    let jobs = ops
        .iter()
        .enumerate()
        .map(|(k, &op)| {
            let bufs = if op == Op::Barrier {
                vec![Vec::new(); world]
            } else {
                initial(op, world, n, k as u64)
            };
            Job::new(Collective::new(op), bufs)
        })
        .collect();
    (jobs, ops)
}

#[test]
fn lossy_reordering_networks_give_exact_results() {
    for algo in ALGOS {
        for codec in [Codec::F32, Codec::I16(Rounding::Stochastic)] {
            for world in [2, 3, 5, 8] {
                let n = 2003;
                let cfg = engine_config(algo, codec, 128);
                let (mut clean, ops) = jobs(world, n);
                let inputs: Vec<Vec<Vec<f32>>> = clean.iter().map(|j| j.bufs.clone()).collect();
                Sim::new(world, cfg.clone(), SimConfig::default())
                    .unwrap()
                    .run(&mut clean)
                    .unwrap();
                for (j, op) in ops.iter().enumerate() {
                    if *op != Op::Barrier {
                        check(*op, algo, codec, &inputs[j], &clean[j].bufs, "clean");
                    }
                }
                for seed in 0..12 {
                    let (mut lossy, _) = jobs(world, n);
                    let report = Sim::new(world, cfg.clone(), SimConfig::lossy(seed))
                        .unwrap()
                        .run(&mut lossy)
                        .unwrap_or_else(|e| {
                            panic!(
                                "{algo:?} {} world {world} seed {seed}: {e}",
                                codec_name(codec)
                            )
                        });
                    assert!(report.retransmissions > 0 || report.messages < 20);
                    for (a, b) in clean.iter().zip(&lossy) {
                        for (x, y) in a.bufs.iter().zip(&b.bufs) {
                            assert!(
                                x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
                                "{algo:?} {} world {world} seed {seed}: {:?} differs from the clean run",
                                codec_name(codec),
                                a.collective.op
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn peers_running_ahead_are_buffered() {
    // Large compute jitter: some ranks start collective k+1 long before
    // others finish k.
    let cfg = SimConfig {
        compute_jitter_ns: 5_000_000,
        ..SimConfig::lossy(3)
    };
    for algo in ALGOS {
        let (mut js, _) = jobs(6, 300);
        let report = Sim::new(6, engine_config(algo, Codec::F32, 64), cfg.clone())
            .unwrap()
            .run(&mut js)
            .unwrap();
        let early: u64 = report.counters.iter().map(|c| c.early_buffered).sum();
        assert!(
            early > 0,
            "{algo:?}: no message arrived early, the test does not exercise buffering"
        );
    }
}

#[test]
fn a_stall_is_reported_not_hung() {
    let mut s = Sim::new(3, Config::default(), SimConfig::default()).unwrap();
    // Rank 0 never sees a message of the current collective.
    s.set_tamper(Box::new(|_, to, bytes| {
        if to == 0 {
            bytes[8] = bytes[8].wrapping_add(1);
        }
    }));
    let mut js = vec![Job::new(
        Collective::all_reduce(ReduceOp::Sum),
        vec![vec![1.0; 10]; 3],
    )];
    match s.run(&mut js) {
        Err(Error::Stalled { detail, .. }) => assert!(detail.contains("rank 0"), "{detail}"),
        other => panic!("expected a stall, got {other:?}"),
    }
}

#[test]
fn a_link_that_loses_everything_is_refused_not_simulated_for_ever() {
    use collectives::sim::LinkModel;
    let lossy = |loss: f64, reorder: f64| SimConfig {
        link: LinkModel {
            loss,
            reorder,
            ..LinkModel::default()
        },
        ..SimConfig::default()
    };
    for (loss, reorder) in [(1.0, 0.0), (f64::NAN, 0.0), (-0.1, 0.0), (0.0, 1.5)] {
        let err = Sim::new(2, Config::default(), lossy(loss, reorder)).err();
        assert!(
            matches!(err, Some(Error::Config(_))),
            "loss {loss}, reorder {reorder}: {err:?}"
        );
    }
    // One bad link among good ones is refused too.
    let one_bad = SimConfig {
        links: vec![(0, 1, lossy(1.0, 0.0).link)],
        ..SimConfig::default()
    };
    assert!(Sim::new(2, Config::default(), one_bad).is_err());
    // Heavy loss below 1 still delivers.
    let mut s = Sim::new(2, Config::default(), lossy(0.9, 1.0)).unwrap();
    let mut js = vec![Job::new(
        Collective::all_reduce(ReduceOp::Sum),
        vec![vec![1.0; 10]; 2],
    )];
    s.run(&mut js).unwrap();
    assert_eq!(js[0].bufs[1], vec![2.0; 10]);
}

#[test]
fn world_of_one_completes_without_messages() {
    for algo in [
        Algo::Auto,
        Algo::Ring,
        Algo::Direct,
        Algo::RecursiveDoubling,
    ] {
        let mut s = Sim::new(
            1,
            engine_config(algo, Codec::I16(Rounding::Nearest), 16),
            SimConfig::default(),
        )
        .unwrap();
        let x = input(0, 100, 1);
        let mut js = vec![
            Job::new(Collective::all_reduce(ReduceOp::Avg), vec![x.clone()]),
            Job::new(Collective::barrier(), vec![vec![]]),
        ];
        let rep = s.run(&mut js).unwrap();
        assert_eq!(
            js[0].bufs[0], x,
            "{algo:?}: world 1 must return the input exactly"
        );
        assert_eq!(rep.messages, 0);
    }
}

/// Links differ: rank 1's links to the others get a tenth of the
/// bandwidth (and loss of their own), as behind a slow NIC. Every
/// algorithm still gives the clean run's bits, and the slow links, not the
/// fast ones, set the pace: the all-reduce takes several times as long as
/// on uniform links.
#[test]
fn one_slow_uplink_sets_the_pace_and_changes_no_bit() {
    use collectives::sim::LinkModel;
    let world = 4;
    let n = 1 << 16;
    for algo in ALGOS {
        let cfg = engine_config(algo, Codec::F32, 4096);
        let run = |sim_cfg: SimConfig| {
            let mut jobs = vec![Job::new(
                Collective::all_reduce(ReduceOp::Sum),
                initial(Op::AllReduce(ReduceOp::Sum), world, n, 9),
            )];
            let report = Sim::new(world, cfg.clone(), sim_cfg)
                .unwrap()
                .run(&mut jobs)
                .unwrap_or_else(|e| panic!("{algo:?}: {e}"));
            (report.time_ns, jobs.remove(0).bufs)
        };
        let uniform = SimConfig::default();
        let slow = LinkModel {
            bytes_per_sec: uniform.link.bytes_per_sec / 10,
            loss: 0.05,
            ..uniform.link.clone()
        };
        let mut one_slow = SimConfig::default();
        for to in [0, 2, 3] {
            one_slow.links.push((1, to, slow.clone()));
        }
        assert_eq!(one_slow.link(1, 2).loss, 0.05);
        assert_eq!(
            one_slow.link(2, 1).loss,
            0.0,
            "only rank 1's sends are slow"
        );
        let (t_uniform, clean) = run(uniform);
        let (t_slow, got) = run(one_slow);
        for (a, b) in clean.iter().zip(&got) {
            assert!(
                a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits()),
                "{algo:?}: slow links changed the result"
            );
        }
        assert!(
            t_slow > 3 * t_uniform,
            "{algo:?}: {t_slow} ns with a slow uplink against {t_uniform} ns uniform"
        );
    }
}

/// A duplicate that arrives before its collective starts stays unread
/// when the collective completes without it. It used to stay kept, and
/// its bytes counted against `max_early_bytes`, for ever: an honest
/// rank's early messages then found no room.
#[test]
fn a_duplicate_kept_for_a_collective_is_dropped_when_it_ends() {
    use collectives::engine::Engine;
    const CHUNK: usize = 64;
    let all_reduce = Collective::all_reduce(ReduceOp::Sum);
    let config = Config {
        algo: Algo::RecursiveDoubling,
        chunk_elems: CHUNK,
        ..Config::default()
    };
    // Rank 1 starts a collective of `chunks` chunks in `buf`; its
    // messages to rank 0.
    let start = |one: &mut Engine, buf: &mut Vec<f32>, chunks: usize| -> Vec<Vec<u8>> {
        *buf = vec![1.0f32; CHUNK * chunks];
        one.start(all_reduce, buf).unwrap();
        std::iter::from_fn(|| one.poll_send())
            .map(|o| {
                assert_eq!(o.to, 0);
                o.bytes
            })
            .collect()
    };
    let mut probe = Engine::new(1, 2, config.clone()).unwrap();
    let x = start(&mut probe, &mut Vec::new(), 1)[0].len();
    // Room for two messages: collective 0's and its duplicate, and then
    // collective 1's two chunks.
    let config = Config {
        max_early_bytes: 2 * x,
        ..config
    };
    let mut zero = Engine::new(0, 2, config.clone()).unwrap();
    let mut one = Engine::new(1, 2, config).unwrap();
    let mut ones = Vec::new();
    let first = start(&mut one, &mut ones, 1);
    assert_eq!(first.len(), 1);
    for bytes in [&first[0], &first[0]] {
        zero.handle(1, bytes, &mut []).unwrap();
    }
    let mut zeros = vec![1.0f32; CHUNK];
    zero.start(all_reduce, &mut zeros).unwrap();
    assert_eq!(zeros[0], 2.0, "collective 0 completed on rank 0");
    // Rank 1 completes collective 0 with rank 0's message, and starts the
    // next one, of two chunks, ahead of rank 0.
    while let Some(o) = zero.poll_send() {
        one.handle(0, &o.bytes, &mut ones).unwrap();
    }
    assert_eq!(ones[0], 2.0, "collective 0 completed on rank 1");
    let second = start(&mut one, &mut ones, 2);
    assert_eq!(second.len(), 2);
    for bytes in &second {
        zero.handle(1, bytes, &mut [])
            .expect("room for rank 1's early messages");
    }
}
