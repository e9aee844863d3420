//! `Lanes` over kernel UDP on 127.0.0.1, one rank per thread, each rank
//! with several lanes (a communicator and a socket each): large buckets
//! are split over the lanes, give the reference result on every rank, and
//! every lane carries its part (reduce-scatter and all-gather too, with
//! their results laid out by rank); small buckets stay on lane 0; a dead
//! rank fails the call and the lanes refuse more.

mod common;

use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use collectives::driver::lanes::MIN_SPLIT_PARTS;
use collectives::driver::{Communicator, DriverConfig, Lanes};
use collectives::{shard_range, Error, Op, ReduceOp};

const LANES: usize = 5;
/// Small, so the test splits buckets of a few thousand elements.
const MIN_LANE_BYTES: usize = 4096;

fn value(rank: usize, i: usize) -> f32 {
    ((i * 7 + rank * 13) % 64) as f32 * 0.25 - 8.0
}

/// Runs `f` on `world` ranks, each in a thread with `LANES` lanes.
fn on_ranks<T: Send + 'static>(
    world: usize,
    cfg: DriverConfig,
    f: impl Fn(Lanes) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let addrs: Vec<Vec<SocketAddrV4>> = (0..LANES).map(|_| common::loopback_addrs(world)).collect();
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let (addrs, cfg, f) = (addrs.clone(), cfg.clone(), f.clone());
            std::thread::spawn(move || {
                let comms = addrs
                    .into_iter()
                    .map(|peers| Communicator::new(r, world, peers, cfg.clone()).unwrap())
                    .collect();
                f(Lanes::new(comms, vec![None; LANES], MIN_LANE_BYTES))
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Collective data each lane's engine sent (idle lanes still exchange
/// acknowledgements, so wire bytes would not tell).
fn lane_bytes_sent(l: &Lanes) -> Vec<u64> {
    (0..l.lanes())
        .map(|k| l.lane(k).counters().engine.bytes_sent)
        .collect()
}

#[test]
fn large_buckets_split_over_every_lane_and_match_the_reference() {
    let world = 3;
    // Below 4 x 4096 bytes (MIN_SPLIT_PARTS parts) a bucket stays on lane
    // 0; from there on it is split over as many lanes as get 4096 bytes
    // each: four (the fifth only keeps its traffic moving), then all five
    // from 5 x 4096 bytes on. 100_003 is prime.
    let sizes = [
        1usize,
        1000,
        4 * 1024 - 1,
        4 * 1024,
        5 * 1024 - 1,
        5 * 1024,
        100_003,
    ];
    let out = on_ranks(world, DriverConfig::default(), move |mut l| {
        let r = l.rank();
        let mut results = Vec::new();
        let mut traffic = Vec::new();
        for &n in &sizes {
            let mut buf: Vec<f32> = (0..n).map(|i| value(r, i)).collect();
            let before = lane_bytes_sent(&l);
            l.all_reduce(&mut buf, ReduceOp::Sum)
                .unwrap_or_else(|e| panic!("rank {r}, {n} elements: {e}"));
            let after = lane_bytes_sent(&l);
            let used: Vec<bool> = before.iter().zip(&after).map(|(b, a)| a > b).collect();
            results.push(buf);
            traffic.push((l.lanes_for(Op::AllReduce(ReduceOp::Sum), n), used));
        }
        let mut bc = vec![r as f32; 50_000];
        let before = lane_bytes_sent(&l);
        l.broadcast(&mut bc, 1).unwrap();
        let bc_used: Vec<bool> = before
            .iter()
            .zip(lane_bytes_sent(&l))
            .map(|(b, a)| a > *b)
            .collect();
        let counters = l.counters();
        l.shutdown().unwrap();
        (results, traffic, bc, bc_used, counters)
    });
    for (k, &n) in sizes.iter().enumerate() {
        for i in 0..n {
            let want: f32 = (0..world).map(|r| value(r, i)).sum();
            let got = out[0].0[k][i];
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                "size {n}, element {i}: {got} != {want}"
            );
        }
        for r in 1..world {
            assert_eq!(out[r].0[k], out[0].0[k], "rank {r} differs at size {n}");
        }
        let (lanes, used) = &out[0].1[k];
        let fit = (n * 4 / MIN_LANE_BYTES).min(LANES);
        let expect = if fit >= MIN_SPLIT_PARTS { fit } else { 1 };
        assert_eq!(*lanes, expect, "lanes for {n} elements");
        for (lane, &u) in used.iter().enumerate() {
            assert_eq!(u, lane < expect, "size {n}: lane {lane} sent data: {u}");
        }
    }
    // The root sends a part on every lane.
    assert_eq!(out[1].3, vec![true; LANES], "broadcast used every lane");
    for o in &out {
        assert!(o.2.iter().all(|&v| v == 1.0), "broadcast from rank 1");
        // One wake-up per collective, however many lanes ran it.
        assert_eq!(o.4.wakeups, sizes.len() as u64 + 1);
    }
}

#[test]
fn reduce_scatter_and_all_gather_split_over_lanes_and_keep_the_rank_layout() {
    // Three ranks, so shards and their pieces are uneven; 100_003 is
    // prime. Each lane carries a piece of every rank's shard (see
    // driver::lane_layout): a piece landing in the wrong shard shows up
    // as a wrong element here.
    let world = 3;
    let sizes = [1000usize, 5 * 1024, 100_003];
    let out = on_ranks(world, DriverConfig::default(), move |mut l| {
        let r = l.rank();
        let mut rows = Vec::new();
        for &n in &sizes {
            let mut rs: Vec<f32> = (0..n).map(|i| value(r, i)).collect();
            let before = lane_bytes_sent(&l);
            l.run(
                collectives::Collective::reduce_scatter(ReduceOp::Sum),
                &mut rs,
            )
            .unwrap_or_else(|e| panic!("rank {r}, reduce-scatter of {n}: {e}"));
            let rs_used = used(&before, &lane_bytes_sent(&l));

            // The other shards hold junk that must be overwritten.
            let mut ag = vec![-1f32; n];
            for i in shard_range(n, world, r) {
                ag[i] = i as f32;
            }
            let before = lane_bytes_sent(&l);
            l.run(collectives::Collective::all_gather(), &mut ag)
                .unwrap_or_else(|e| panic!("rank {r}, all-gather of {n}: {e}"));
            let ag_used = used(&before, &lane_bytes_sent(&l));
            let lanes = l.lanes_for(Op::AllGather, n);
            rows.push((
                rs[shard_range(n, world, r)].to_vec(),
                rs_used,
                ag,
                ag_used,
                lanes,
            ));
        }
        let wakeups = l.counters().wakeups;
        l.shutdown().unwrap();
        (rows, wakeups)
    });
    for (r, (rows, wakeups)) in out.iter().enumerate() {
        for (&n, (rs, rs_used, ag, ag_used, lanes)) in sizes.iter().zip(rows) {
            for (j, i) in shard_range(n, world, r).enumerate() {
                let want: f32 = (0..world).map(|q| value(q, i)).sum();
                assert_eq!(
                    rs[j], want,
                    "rank {r}, size {n}: reduce-scatter element {i}"
                );
            }
            for (i, &v) in ag.iter().enumerate() {
                assert_eq!(v, i as f32, "rank {r}, size {n}: all-gather element {i}");
            }
            let fit = (n * 4 / MIN_LANE_BYTES).min(LANES);
            let expect = if fit >= MIN_SPLIT_PARTS { fit } else { 1 };
            assert_eq!(*lanes, expect, "lanes for {n} elements");
            let want_used: Vec<bool> = (0..LANES).map(|k| k < expect).collect();
            assert_eq!(
                rs_used, &want_used,
                "rank {r}, size {n}: lanes of the reduce-scatter"
            );
            assert_eq!(
                ag_used, &want_used,
                "rank {r}, size {n}: lanes of the all-gather"
            );
        }
        assert_eq!(
            *wakeups,
            2 * sizes.len() as u64,
            "one wake-up per collective"
        );
    }
}

/// Which lanes sent collective data between two readings.
fn used(before: &[u64], after: &[u64]) -> Vec<bool> {
    before.iter().zip(after).map(|(b, a)| a > b).collect()
}

#[test]
fn a_dead_rank_fails_the_call_and_the_lanes_refuse_more_work() {
    let world = 3;
    let cfg = DriverConfig {
        timeout: Duration::from_secs(1),
        ..DriverConfig::default()
    };
    let out = on_ranks(world, cfg, move |mut l| {
        if l.rank() == 2 {
            // Dies silently: sockets stay open, nothing answers.
            std::mem::forget(l);
            return None;
        }
        let start = Instant::now();
        let mut buf = vec![1.0f32; 100_000];
        let err = l.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
        let took = start.elapsed();
        let again = l.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
        Some((err, again, took, l))
    });
    for (r, o) in out.into_iter().enumerate().take(2) {
        let (err, again, took, _lanes) = o.unwrap();
        assert!(took < Duration::from_secs(10), "rank {r} took {took:?}");
        assert!(
            matches!(err, Error::PeerTimeout { rank: 2, .. }),
            "rank {r}: {err}"
        );
        assert!(matches!(again, Error::Failed(_)), "rank {r}: {again}");
        assert!(again.to_string().contains("rank 2"), "{again}");
        // The cause stays typed: callers find the rank at fault.
        assert_eq!(again.peer_at_fault(), Some(2), "rank {r}: {again:?}");
    }
}

/// A collective the lanes refuse outright (a broadcast from a rank that
/// does not exist) leaves them usable, as it leaves a communicator, on
/// one lane and split over all of them: it used to fail them for good.
#[test]
fn a_refused_collective_leaves_the_lanes_usable() {
    let out = on_ranks(2, DriverConfig::default(), |mut l| {
        let mut sums = Vec::new();
        // 1000 elements run on lane 0; 100,000 are split over the lanes.
        for len in [1000, 100_000] {
            let mut buf = vec![1.0f32; len];
            let refused = l.broadcast(&mut buf, 99).unwrap_err();
            assert!(
                matches!(refused, Error::RankOutOfRange { rank: 99, .. }),
                "{len}: {refused}"
            );
            l.all_reduce(&mut buf, ReduceOp::Sum)?;
            let lanes = l.lanes_for(collectives::Op::Broadcast { root: 0 }, len);
            sums.push((lanes, buf[len - 1]));
        }
        Ok::<_, Error>(sums)
    });
    for (r, o) in out.into_iter().enumerate() {
        let sums = o.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(sums, vec![(1, 2.0), (LANES, 2.0)], "rank {r}");
    }
}

#[test]
fn a_handshake_packet_lost_on_one_lane_does_not_hold_up_the_others() {
    // Rank 0 dials rank 1 on every lane. Its hello on lane 0 (the small
    // datagram that names it) is lost: rank 0 counts lane 0 as
    // connected, rank 1 waits for the retransmission. Lanes that
    // connected one after another left rank 0 waiting in lane 1's
    // rendezvous for rank 1, which waited in lane 0 for rank 0, until the
    // connect timeout (8 s here; checked). Connected at once, rank 0's
    // lanes all connect, its first collective moves lane 0 again, and
    // the hello goes out once more.
    let world = 2;
    let lanes = 2;
    let master_port = {
        // Two consecutive free ports for the lanes' rendezvous.
        loop {
            let a = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
            let p = a.local_addr().unwrap().port();
            if p < u16::MAX && std::net::TcpListener::bind(("0.0.0.0", p + 1)).is_ok() {
                break p;
            }
        }
    };
    let cfg = DriverConfig {
        connect_timeout: Duration::from_secs(8),
        ..DriverConfig::default()
    };
    let start = Instant::now();
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let cfg = cfg.clone();
            std::thread::spawn(move || {
                let env = collectives::driver::RankEnv::from_lookup(|k| match k {
                    "RANK" => Some(r.to_string()),
                    "WORLD_SIZE" => Some(world.to_string()),
                    "MASTER_ADDR" => Some("127.0.0.1".into()),
                    "MASTER_PORT" => Some(master_port.to_string()),
                    _ => None,
                })
                .unwrap();
                let ios = (0..lanes)
                    .map(|k| {
                        let inner = stack::io::kernel::KernelUdp::bind(
                            "127.0.0.1:0".parse().unwrap(),
                            cfg.udp.clone(),
                        )
                        .unwrap();
                        let addr = inner.local_addr();
                        let mut io = common::faulty::Faulty::new(inner);
                        if r == 0 && k == 0 {
                            io.lose_small = 2;
                        }
                        (io, addr)
                    })
                    .collect();
                let mut l = Lanes::connect(&env, ios, cfg, &[None, None]).unwrap();
                let mut buf = vec![1.0f32; 1000];
                l.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
                assert!(buf.iter().all(|&v| v == 2.0));
                l.shutdown().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().expect("a rank failed");
    }
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn a_lane_that_panics_fails_the_call_instead_of_hanging_it() {
    // Rank 0's lane 1 panics in the middle of a split all-reduce. Its
    // other lanes finish their parts and wait for the rest of the rank's
    // lanes: the panicking one must count as done, or they wait for ever.
    let world = 2;
    let cfg = DriverConfig {
        timeout: Duration::from_secs(2),
        ..DriverConfig::default()
    };
    let addrs: Vec<Vec<SocketAddrV4>> = (0..2).map(|_| common::loopback_addrs(world)).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    for r in 0..world {
        let (addrs, cfg, tx) = (addrs.clone(), cfg.clone(), tx.clone());
        std::thread::spawn(move || {
            let comms = addrs
                .into_iter()
                .enumerate()
                .map(|(k, peers)| {
                    let inner =
                        stack::io::kernel::KernelUdp::bind(peers[r], cfg.udp.clone()).unwrap();
                    let mut io = common::faulty::Faulty::new(inner);
                    io.panic_after = (r == 0 && k == 1).then_some(200);
                    Communicator::with_backend(r, world, io, peers, cfg.clone()).unwrap()
                })
                .collect();
            let mut l = Lanes::new(comms, vec![None, None], MIN_LANE_BYTES);
            let mut buf = vec![1.0f32; 1 << 20];
            let t = Instant::now();
            let result = l.all_reduce(&mut buf, ReduceOp::Sum);
            tx.send((r, result.map_err(|e| e.to_string()), t.elapsed()))
                .unwrap();
        });
    }
    for _ in 0..world {
        let (r, result, took) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("a rank hung in a split all-reduce");
        assert!(result.is_err(), "rank {r}: {result:?}");
        if r == 0 {
            assert!(result.unwrap_err().contains("panicked"), "rank 0");
        }
        assert!(took < Duration::from_secs(15), "rank {r} took {took:?}");
    }
}
