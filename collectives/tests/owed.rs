//! What a stalled collective knows about the ranks it waits on
//! (`Engine::owed`): the messages each peer still owes, and which of them
//! a peer sends as soon as it enters, so that a rank that never entered
//! is named (`Error::NoProgress`) rather than everyone it holds up.

use std::collections::VecDeque;

use collectives::{Algo, Codec, Collective, Config, Engine, Op, ReduceOp, Rounding};

const ALGOS: [Algo; 3] = [Algo::Ring, Algo::Direct, Algo::RecursiveDoubling];

fn ops(world: usize) -> Vec<Op> {
    vec![
        Op::AllReduce(ReduceOp::Sum),
        Op::ReduceScatter(ReduceOp::Sum),
        Op::AllGather,
        Op::Broadcast { root: 0 },
        Op::Broadcast { root: world - 1 },
        Op::Barrier,
    ]
}

fn engines(world: usize, algo: Algo, codec: Codec) -> Vec<Engine> {
    let cfg = Config {
        algo,
        codec,
        // Several chunks per shard even for small buffers.
        chunk_elems: 16,
        ..Config::default()
    };
    (0..world)
        .map(|r| Engine::new(r, world, cfg.clone()).unwrap())
        .collect()
}

fn input(op: Op, r: usize, count: usize) -> Vec<f32> {
    if op == Op::Barrier {
        return Vec::new();
    }
    (0..count).map(|i| (r * 1000 + i) as f32 * 0.001).collect()
}

type Wire = VecDeque<(usize, usize, Vec<u8>)>;

/// Every rank but those in `absent` starts `op`; what their starts sent,
/// as (from, to, bytes).
fn start(es: &mut [Engine], bufs: &mut [Vec<f32>], op: Op, absent: &[usize]) -> Wire {
    let mut wire = Wire::new();
    for (r, (e, b)) in es.iter_mut().zip(bufs.iter_mut()).enumerate() {
        if absent.contains(&r) {
            continue;
        }
        e.start(Collective::new(op), b).unwrap();
        while let Some(m) = e.poll_send() {
            wire.push_back((r, m.to, m.bytes));
        }
    }
    wire
}

/// Before any message moves, each rank expects from each peer exactly
/// what that peer's start sent it as "sent on entry", and owes nothing
/// to itself.
#[test]
fn what_a_rank_expects_on_entry_is_what_its_peers_send_when_they_start() {
    for world in 1..=8 {
        for algo in ALGOS {
            for op in ops(world) {
                for count in [1, 5, 16 * world + 3, 131] {
                    let mut es = engines(world, algo, Codec::F32);
                    let mut bufs: Vec<_> = (0..world).map(|r| input(op, r, count)).collect();
                    let mut sent = vec![vec![0; world]; world];
                    for (from, to, _) in start(&mut es, &mut bufs, op, &[]) {
                        sent[to][from] += 1;
                    }
                    for (r, e) in es.iter().enumerate() {
                        let owed = e.owed();
                        let what = format!("{op:?} {algo:?} world {world} count {count} rank {r}");
                        assert!(owed.iter().all(|o| o.rank != r), "{what}: {owed:?}");
                        for p in (0..world).filter(|&p| p != r) {
                            let on_entry = owed.iter().find(|o| o.rank == p).map_or(0, |o| {
                                assert_eq!(o.received, 0, "{what}");
                                assert!(o.on_entry <= o.expected, "{what}: {o:?}");
                                o.on_entry
                            });
                            assert_eq!(on_entry, sent[r][p], "{what}: from rank {p}");
                        }
                    }
                }
            }
        }
    }
}

/// Delivers `wire` and every message it leads to among the ranks that
/// started (what is sent to an absent rank is dropped) until none is
/// left.
fn run_until_quiet(es: &mut [Engine], bufs: &mut [Vec<f32>], mut wire: Wire, absent: &[usize]) {
    while let Some((from, to, bytes)) = wire.pop_front() {
        if absent.contains(&to) {
            continue;
        }
        es[to].handle(from, &bytes, &mut bufs[to]).unwrap();
        while let Some(m) = es[to].poll_send() {
            wire.push_back((to, m.to, m.bytes));
        }
    }
}

/// One rank never enters the collective. Every other rank is held up;
/// a rank names the absent one as not entered exactly when the absent
/// rank would have sent it something on entering (with the direct
/// algorithm, every rank), and names nobody else.
#[test]
fn a_rank_that_never_enters_is_named_by_the_ranks_it_sends_to_on_entry() {
    let codecs = [Codec::F32, Codec::I16(Rounding::Nearest)];
    for world in 2..=8 {
        for algo in ALGOS {
            for codec in codecs {
                for op in [
                    Op::AllReduce(ReduceOp::Sum),
                    Op::ReduceScatter(ReduceOp::Sum),
                    Op::AllGather,
                ] {
                    // Whom each rank's start sends to, all ranks present.
                    let mut es = engines(world, algo, codec);
                    let mut bufs: Vec<_> = (0..world).map(|r| input(op, r, 77)).collect();
                    let on_entry = start(&mut es, &mut bufs, op, &[]);
                    for absent in 0..world {
                        let what = format!(
                            "{op:?} {algo:?} {codec:?} world {world}, rank {absent} absent"
                        );
                        let mut es = engines(world, algo, codec);
                        let mut bufs: Vec<_> = (0..world).map(|r| input(op, r, 77)).collect();
                        let wire = start(&mut es, &mut bufs, op, &[absent]);
                        run_until_quiet(&mut es, &mut bufs, wire, &[absent]);
                        for (r, e) in es.iter().enumerate().filter(|&(r, _)| r != absent) {
                            let owed = e.owed();
                            // Every rank needs the absent rank's data.
                            assert!(!owed.is_empty(), "{what}: rank {r} is owed nothing");
                            let not_entered: Vec<usize> = owed
                                .iter()
                                .filter(|o| o.not_entered())
                                .map(|o| o.rank)
                                .collect();
                            let sends_here = on_entry.iter().any(|m| m.0 == absent && m.1 == r);
                            let want: &[usize] = if sends_here { &[absent] } else { &[] };
                            assert_eq!(not_entered, want, "{what}: rank {r} ({owed:?})");
                            if algo == Algo::Direct {
                                assert!(sends_here, "{what}: rank {r}");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// While a message is missing, only its sender is owed; once the
/// collective completes, nothing is.
#[test]
fn a_missing_message_is_owed_by_its_sender_and_nothing_after_completion() {
    for algo in ALGOS {
        let world = 5;
        let op = Op::AllReduce(ReduceOp::Sum);
        let mut es = engines(world, algo, Codec::F32);
        let mut bufs: Vec<_> = (0..world).map(|r| input(op, r, 40)).collect();
        let mut wire = start(&mut es, &mut bufs, op, &[]);
        // Hold back the first message sent to rank 0.
        let mut held = None;
        while let Some((from, to, bytes)) = wire.pop_front() {
            if to == 0 && held.is_none() {
                held = Some((from, bytes));
                continue;
            }
            es[to].handle(from, &bytes, &mut bufs[to]).unwrap();
            while let Some(m) = es[to].poll_send() {
                wire.push_back((to, m.to, m.bytes));
            }
        }
        let (from, bytes) = held.expect("rank 0 receives");
        let owed = es[0].owed();
        // Only its sender is owed, at least that message (a ring owes the
        // later ones too: they come round through rank 0 itself).
        assert_eq!(owed.len(), 1, "{algo:?}: {owed:?}");
        assert_eq!(owed[0].rank, from, "{algo:?}");
        assert!(owed[0].received < owed[0].expected, "{algo:?}: {owed:?}");
        // Whatever it leads to finishes every rank.
        run_until_quiet(&mut es, &mut bufs, Wire::from([(from, 0, bytes)]), &[]);
        for (r, e) in es.iter().enumerate() {
            assert!(!e.is_active(), "{algo:?}: rank {r} still running");
            assert!(e.owed().is_empty(), "{algo:?}: rank {r}");
        }
    }
}
