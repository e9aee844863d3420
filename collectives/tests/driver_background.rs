//! `Background`: a communicator (or a rank's lanes) on a progress thread,
//! over kernel UDP on 127.0.0.1, one rank per test thread. Collectives
//! complete while the caller never calls in, run in the order started with
//! reference results, fail clearly when a peer leaves, and are run to the
//! end when the caller drops the handle.

mod common;

use std::time::{Duration, Instant};

use collectives::driver::{Background, Communicator, DriverConfig, Lanes};
use collectives::{bf16, shard_range, Collective, Error, ReduceOp};

fn value(rank: usize, i: usize) -> f32 {
    ((i * 7 + rank * 13) % 64) as f32 * 0.25 - 8.0
}

/// Runs `f` on `world` ranks, each in a thread with its communicator on a
/// progress thread of its own.
fn on_ranks<T: Send + 'static>(
    world: usize,
    cfg: DriverConfig,
    f: impl Fn(Background<Communicator>) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let peers = common::loopback_addrs(world);
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let (peers, cfg, f) = (peers.clone(), cfg.clone(), f.clone());
            std::thread::spawn(move || {
                let comm = Communicator::new(r, world, peers, cfg).unwrap();
                f(Background::spawn(comm, None).unwrap())
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn sum_reference(world: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (0..world).map(|r| value(r, i)).sum())
        .collect()
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "element {i}: {g} != {w}"
        );
    }
}

#[test]
fn a_collective_completes_while_the_caller_never_calls_in() {
    // 8 MiB: far more than one round of the loop moves. The caller only
    // sleeps and asks whether the result is in (which moves nothing).
    let world = 2;
    let n = 2 << 20;
    let out = on_ranks(world, DriverConfig::default(), move |mut bg| {
        let r = bg.rank();
        let buf: Vec<f32> = (0..n).map(|i| value(r, i)).collect();
        let mut p = bg.start(Collective::all_reduce(ReduceOp::Sum), buf);
        let t = Instant::now();
        while !p.test() {
            assert!(t.elapsed() < Duration::from_secs(20), "no progress");
            std::thread::sleep(Duration::from_millis(5));
        }
        let result = p.wait().unwrap();
        let counters = bg.counters().unwrap();
        (result, counters)
    });
    let want = sum_reference(world, n);
    for (result, counters) in &out {
        assert_close(result, &want);
        assert_eq!(counters.wakeups, 1);
        assert!(counters.wire.bytes_received >= (n * 4 / 2) as u64);
    }
    assert_eq!(out[0].0, out[1].0, "ranks differ");
}

#[test]
fn buckets_started_back_to_back_run_in_order_with_reference_results() {
    let world = 3;
    let (n_sum, n_bc, n_ag, n_rs) = (100_003usize, 7usize, 3000usize, 1001usize);
    let out = on_ranks(world, DriverConfig::default(), move |mut bg| {
        let r = bg.rank();
        let sum = (0..n_sum).map(|i| value(r, i)).collect();
        let bc = vec![r as f32; n_bc];
        let mut ag = vec![0f32; n_ag];
        for i in shard_range(n_ag, world, r) {
            ag[i] = i as f32;
        }
        let rs = (0..n_rs).map(|i| value(r, i)).collect();
        let pending = vec![
            bg.start(Collective::all_reduce(ReduceOp::Sum), sum),
            bg.start(Collective::broadcast(2), bc),
            bg.start(Collective::all_gather(), ag),
            bg.start(Collective::reduce_scatter(ReduceOp::Max), rs),
            bg.start(Collective::barrier(), Vec::new()),
            bg.start(Collective::all_reduce(ReduceOp::Avg), vec![r as f32]),
        ];
        // A bf16 bucket queued behind them, waited for first.
        let half = bg.start_bf16(
            Collective::all_reduce(ReduceOp::Sum),
            vec![bf16::from_f32(0.5 + r as f32); 5],
        );
        assert_eq!(half.wait().unwrap(), vec![bf16::from_f32(4.5); 5]);
        // Waited for in reverse: each result is kept until asked for.
        let mut results: Vec<Vec<f32>> = pending
            .into_iter()
            .rev()
            .map(|p| p.wait().unwrap())
            .collect();
        results.reverse();
        (r, results, bg.counters().unwrap().wakeups)
    });
    let sum = sum_reference(world, n_sum);
    for (r, res, wakeups) in &out {
        assert_close(&res[0], &sum);
        assert_eq!(res[1], vec![2.0; n_bc]);
        assert_eq!(res[2], (0..n_ag).map(|i| i as f32).collect::<Vec<_>>());
        for i in shard_range(n_rs, world, *r) {
            let want = (0..world).map(|q| value(q, i)).fold(f32::MIN, f32::max);
            assert_eq!(res[3][i], want, "rank {r} element {i}");
        }
        assert!(res[4].is_empty());
        assert_eq!(res[5], vec![1.0]); // (0 + 1 + 2) / 3
        assert_eq!(*wakeups, 7);
        assert_eq!(res[0], out[0].1[0], "rank {r} differs from rank 0");
    }
}

#[test]
fn a_rank_that_leaves_early_fails_the_pending_bucket_and_later_ones() {
    // Rank 1 runs one all-reduce and leaves; rank 0 has started three.
    // The first completes, the second names rank 1 at once (not after
    // the 20 s timeout), the third and any later start say the
    // communicator failed, and why.
    let cfg = DriverConfig {
        timeout: Duration::from_secs(20),
        ..DriverConfig::default()
    };
    let out = on_ranks(2, cfg, |mut bg| {
        let t = Instant::now();
        let op = Collective::all_reduce(ReduceOp::Sum);
        if bg.rank() == 1 {
            bg.run(op, vec![1.0; 1000]).unwrap();
            return (vec![bg.shutdown().map(|()| Vec::new())], t.elapsed());
        }
        let pending: Vec<_> = (0..3).map(|_| bg.start(op, vec![1.0; 1000])).collect();
        let mut results: Vec<_> = pending.into_iter().map(|p| p.wait()).collect();
        results.push(bg.run(op, vec![1.0; 1000]));
        (results, t.elapsed())
    });
    let (r0, took) = &out[0];
    assert_eq!(r0[0], Ok(vec![2.0; 1000]));
    assert!(
        matches!(
            r0[1],
            Err(Error::PeerLeft {
                rank: 1,
                completed: 1,
                ..
            })
        ),
        "{:?}",
        r0[1]
    );
    for later in &r0[2..] {
        match later {
            Err(Error::Failed(cause)) => {
                assert!(
                    matches!(**cause, Error::PeerLeft { rank: 1, .. }),
                    "{cause:?}"
                )
            }
            other => panic!("expected the communicator to refuse: {other:?}"),
        }
    }
    assert!(*took < Duration::from_secs(5), "rank 0 took {took:?}");
    assert!(out[1].0[0].is_ok(), "rank 1's shutdown: {:?}", out[1].0[0]);
}

#[test]
fn dropping_it_runs_what_was_started_so_the_peers_finish() {
    // Rank 0 starts two all-reduces and drops both handles and the
    // Background at once; rank 1 joins 300 ms later, so the second is
    // still queued when rank 0 lets go. Rank 1 must get both results: the
    // drop runs queued collectives before leaving.
    let world = 2;
    let n = 1 << 20;
    let out = on_ranks(world, DriverConfig::default(), move |mut bg| {
        let r = bg.rank();
        let buf: Vec<f32> = (0..n).map(|i| value(r, i)).collect();
        if r == 1 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let op = Collective::all_reduce(ReduceOp::Sum);
        let first = bg.start(op, buf.clone());
        let second = bg.start(op, buf);
        if r == 0 {
            drop((first, second));
            drop(bg);
            None
        } else {
            Some((first.wait(), second.wait()))
        }
    });
    let (first, second) = out[1].clone().unwrap();
    let want = sum_reference(world, n);
    assert_close(&first.expect("rank 1's first all-reduce"), &want);
    assert_close(&second.expect("rank 1's second all-reduce"), &want);
}

#[test]
fn a_ranks_lanes_run_on_the_progress_thread_too() {
    // Two lanes per rank: a bucket over 2 x 4 KiB is split between them.
    let world = 2;
    let lanes = 2;
    let n = 50_000;
    let addrs: Vec<_> = (0..lanes).map(|_| common::loopback_addrs(world)).collect();
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let addrs = addrs.clone();
            std::thread::spawn(move || {
                let comms = addrs
                    .into_iter()
                    .map(|peers| {
                        Communicator::new(r, world, peers, DriverConfig::default()).unwrap()
                    })
                    .collect();
                let l = Lanes::new(comms, vec![None; lanes], 4096);
                let mut bg = Background::spawn(l, None).unwrap();
                let buf = (0..n).map(|i| value(r, i)).collect();
                let got = bg.all_reduce(buf, ReduceOp::Sum).unwrap();
                let c = bg.counters().unwrap();
                // Collective data each lane's engine sent: both carried a part.
                let per_lane = bg
                    .with(|l| {
                        (0..l.lanes())
                            .map(|k| l.lane(k).counters().engine.bytes_sent)
                            .collect::<Vec<_>>()
                    })
                    .unwrap();
                bg.shutdown().unwrap();
                (got, c, per_lane)
            })
        })
        .collect();
    let want = sum_reference(world, n);
    for h in hs {
        let (got, c, per_lane) = h.join().unwrap();
        assert_close(&got, &want);
        assert_eq!(c.wakeups, 1);
        assert!(
            per_lane.len() == lanes && per_lane.iter().all(|&b| b > 0),
            "{per_lane:?}"
        );
    }
}

/// A rank whose progress thread answers for it but which never enters the
/// collective (uneven iteration counts, a rank stuck elsewhere): its
/// peers hear it all along, so neither silence nor a stall names it, and
/// the collective used to wait for ever. It fails after the timeout.
#[test]
fn a_collective_a_live_rank_never_enters_fails_after_the_timeout() {
    let cfg = DriverConfig {
        timeout: Duration::from_secs(1),
        ..DriverConfig::default()
    };
    let out = on_ranks(2, cfg, |mut bg| {
        let t = Instant::now();
        if bg.rank() == 1 {
            // Alive, answering pings, never calling in.
            std::thread::sleep(Duration::from_secs(4));
            return None;
        }
        let r = bg.all_reduce(vec![1.0; 1000], ReduceOp::Sum);
        Some((r, t.elapsed()))
    });
    let (r, took) = out[0].as_ref().unwrap();
    match r {
        Err(
            e @ Error::NoProgress {
                seq: 0,
                waited_ms,
                waiting_on,
                not_entered,
            },
        ) => {
            assert!(*waited_ms >= 1000);
            // It names the rank that has not entered, in the message too,
            // and its goodbye blames that rank.
            assert_eq!((&waiting_on[..], &not_entered[..]), (&[1][..], &[1][..]));
            assert!(
                e.to_string().contains("ranks [1] have not entered it"),
                "{e}"
            );
            assert_eq!(e.peer_at_fault(), Some(1));
        }
        other => panic!("expected no progress, got {other:?}"),
    }
    assert!(*took < Duration::from_millis(2500), "took {took:?}");
}
