//! Shared helpers: inputs, f64 references and the documented error bounds.
#![allow(dead_code)]

pub mod faulty;

use collectives::sim::{Job, Sim, SimConfig};
use std::ops::Range;

use collectives::{shard_range, Algo, Codec, Collective, Config, Op, ReduceOp, Rounding};

/// Deterministic inputs in [-1, 1), with a few exact zeros.
pub fn input(rank: usize, n: usize, salt: u64) -> Vec<f32> {
    let mut s = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (rank as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            if i % 97 == 5 {
                0.0
            } else {
                v
            }
        })
        .collect()
}

pub const ALGOS: [Algo; 3] = [Algo::Ring, Algo::Direct, Algo::RecursiveDoubling];

pub fn codec_name(c: Codec) -> &'static str {
    match c {
        Codec::F32 => "f32",
        Codec::I16(Rounding::Nearest) => "i16-nearest",
        Codec::I16(Rounding::Stochastic) => "i16-stochastic",
    }
}

/// Per-quantization error factor `e` of the crate docs.
pub fn quant_factor(c: Codec) -> f64 {
    match c {
        Codec::F32 => 0.0,
        Codec::I16(Rounding::Nearest) => 0.51,
        Codec::I16(Rounding::Stochastic) => 1.01,
    }
}

/// Quantizations on an element's path (crate docs).
pub fn path_len(algo: Algo, world: usize) -> f64 {
    match algo {
        Algo::RecursiveDoubling => {
            let p = 1usize << (usize::BITS - 1 - world.leading_zeros());
            (2 * p - 2 + (world - p)) as f64
        }
        _ => world as f64,
    }
}

pub fn absmax(x: &[f32]) -> f64 {
    x.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64))
}

/// Elements `n/3 .. n/3 + n/8` are this many times larger in `initial`:
/// chunks there get large i16 scales and the others small ones, so a scale
/// shared beyond one chunk would break the per-chunk bound `check` uses.
pub const LARGE: f32 = 1000.0;

/// Builds the per-rank buffers a collective starts from.
pub fn initial(op: Op, world: usize, n: usize, salt: u64) -> Vec<Vec<f32>> {
    let large = n / 3..n / 3 + n / 8;
    (0..world)
        .map(|r| {
            let mut x = input(r, n, salt);
            for v in &mut x[large.clone()] {
                *v *= LARGE;
            }
            match op {
                Op::AllGather => {
                    // Only the own shard is input; poison the rest.
                    let own = shard_range(n, world, r);
                    (0..n)
                        .map(|i| if own.contains(&i) { x[i] } else { 1e30 })
                        .collect()
                }
                Op::Broadcast { root } if r != root => vec![-7.0; n],
                _ => x,
            }
        })
        .collect()
}

/// The elements that share a chunk, and so an i16 scale, with element
/// `i`: chunks split each rank's shard (ring, direct) or the whole buffer
/// (recursive doubling).
fn chunk_span(algo: Algo, n: usize, world: usize, chunk_elems: usize, i: usize) -> Range<usize> {
    let span = match algo {
        Algo::Ring | Algo::Direct => (0..world)
            .map(|p| shard_range(n, world, p))
            .find(|s| s.contains(&i))
            .expect("every element has an owner"),
        _ => 0..n,
    };
    let start = span.start + (i - span.start) / chunk_elems * chunk_elems;
    start..start.saturating_add(chunk_elems).min(span.end)
}

/// `check` with each rank's absmax taken over whole shards (ring,
/// direct) or buffers: valid for any chunk size, looser.
pub fn check(
    op: Op,
    algo: Algo,
    codec: Codec,
    inputs: &[Vec<f32>],
    outputs: &[Vec<f32>],
    what: &str,
) -> f64 {
    check_chunked(op, algo, codec, usize::MAX, inputs, outputs, what)
}

/// Checks every rank's result against an f64 reference and the documented
/// bound, with `A` the sum of the ranks' absmax over the element's chunk
/// of `chunk_elems` (crate docs); returns the largest error seen.
pub fn check_chunked(
    op: Op,
    algo: Algo,
    codec: Codec,
    chunk_elems: usize,
    inputs: &[Vec<f32>],
    outputs: &[Vec<f32>],
    what: &str,
) -> f64 {
    let world = inputs.len();
    let n = inputs[0].len();
    let e = quant_factor(codec);
    let u = 2f64.powi(-24);
    let q = path_len(algo, world);
    let amax: Vec<f64> = inputs.iter().map(|x| absmax(x)).collect();
    // Auto's chunks depend on the algorithm it picks: whole buffers then.
    let chunk_elems = match algo {
        Algo::Auto => usize::MAX,
        _ => chunk_elems,
    };
    // A per element: the ranks' chunk absmax summed, once per chunk.
    let mut a_chunk = vec![0f64; n];
    let mut i = 0;
    while i < n {
        let span = chunk_span(algo, n, world, chunk_elems, i);
        let a: f64 = inputs.iter().map(|x| absmax(&x[span.clone()])).sum();
        a_chunk[span.clone()].fill(a);
        i = span.end;
    }
    let shard_amax: Vec<f64> = (0..world)
        .map(|p| absmax(&inputs[p][shard_range(n, world, p)]))
        .collect();
    let mut worst = 0.0f64;
    // Ranks whose whole buffer is the result must agree bit for bit.
    let identical = !matches!(op, Op::ReduceScatter(_) | Op::Barrier);
    if identical {
        for r in 1..world {
            let same = outputs[r]
                .iter()
                .zip(&outputs[0])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{what}: rank {r} differs from rank 0");
        }
    }
    for (r, out) in outputs.iter().enumerate() {
        let range = match op {
            Op::ReduceScatter(_) => shard_range(n, world, r),
            Op::Barrier => 0..0,
            _ => 0..n,
        };
        for i in range {
            let y = out[i] as f64;
            let a_sum = a_chunk[i];
            let (want, tol) = match op {
                Op::AllReduce(red) | Op::ReduceScatter(red) => {
                    let col = inputs.iter().map(|x| x[i] as f64);
                    let mag: f64 = inputs.iter().map(|x| (x[i] as f64).abs()).sum();
                    match red {
                        ReduceOp::Sum => (
                            col.sum::<f64>(),
                            1e-6 * mag
                                + e * q * a_sum / 32767.0
                                + (world as f64 - 1.0) * u * a_sum * e.signum(),
                        ),
                        ReduceOp::Avg => (
                            col.sum::<f64>() / world as f64,
                            (1e-6 * mag
                                + e * q * a_sum / 32767.0
                                + (world as f64 - 1.0) * u * a_sum * e.signum())
                                / world as f64,
                        ),
                        ReduceOp::Max => (col.fold(f64::MIN, f64::max), e * q * a_sum / 32767.0),
                        ReduceOp::Min => (col.fold(f64::MAX, f64::min), e * q * a_sum / 32767.0),
                    }
                }
                Op::AllGather => {
                    let owner = (0..world)
                        .find(|&p| shard_range(n, world, p).contains(&i))
                        .expect("every element has an owner");
                    (inputs[owner][i] as f64, e * shard_amax[owner] / 32767.0)
                }
                Op::Broadcast { root } => (inputs[root][i] as f64, e * amax[root] / 32767.0),
                Op::Barrier => unreachable!(),
            };
            let err = (y - want).abs();
            assert!(
                err <= tol,
                "{what}: rank {r} element {i}: got {y}, want {want}, error {err:e} > bound {tol:e}"
            );
            worst = worst.max(err);
        }
    }
    worst
}

pub fn engine_config(algo: Algo, codec: Codec, chunk_elems: usize) -> Config {
    Config {
        algo,
        codec,
        chunk_elems,
        ..Config::default()
    }
}

/// Runs `ops` over `sizes` as one job sequence (ranks run ahead into the
/// next job) and checks each result.
pub fn run_matrix(
    algo: Algo,
    codec: Codec,
    world: usize,
    ops: &[Op],
    sizes: &[usize],
    chunk_elems: usize,
    sim: SimConfig,
) {
    let mut jobs = Vec::new();
    let mut meta = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        for (o, &op) in ops.iter().enumerate() {
            let op = match op {
                Op::Broadcast { .. } => Op::Broadcast {
                    root: (k + o) % world,
                },
                op => op,
            };
            let salt = (k * 31 + o) as u64;
            let bufs = if op == Op::Barrier {
                vec![Vec::new(); world]
            } else {
                initial(op, world, n, salt)
            };
            meta.push((op, n, bufs.clone()));
            jobs.push(Job::new(Collective::new(op), bufs));
        }
    }
    let mut s = Sim::new(world, engine_config(algo, codec, chunk_elems), sim).unwrap();
    let report = s
        .run(&mut jobs)
        .unwrap_or_else(|e| panic!("{algo:?} {} world {world}: {e}", codec_name(codec)));
    for (job, (op, n, inputs)) in jobs.iter().zip(&meta) {
        let what = format!("{op:?} {algo:?} {} world {world} n {n}", codec_name(codec));
        if *op != Op::Barrier {
            check_chunked(*op, algo, codec, chunk_elems, inputs, &job.bufs, &what);
        }
    }
    let wake: u64 = report.counters.iter().map(|c| c.wakeups).sum();
    assert_eq!(
        wake,
        (jobs.len() * world) as u64,
        "one wake-up per rank and collective"
    );
}

pub fn all_ops() -> Vec<Op> {
    vec![
        Op::AllReduce(ReduceOp::Sum),
        Op::AllReduce(ReduceOp::Avg),
        Op::AllReduce(ReduceOp::Max),
        Op::AllReduce(ReduceOp::Min),
        Op::ReduceScatter(ReduceOp::Sum),
        Op::ReduceScatter(ReduceOp::Avg),
        Op::ReduceScatter(ReduceOp::Max),
        Op::ReduceScatter(ReduceOp::Min),
        Op::AllGather,
        Op::Broadcast { root: 0 },
        Op::Barrier,
    ]
}

/// Free UDP ports on 127.0.0.1 for `n` ranks, bound and released here
/// and bound again by the ranks. They are taken below the kernel's
/// ephemeral range (32768-60999): a port from there (the kernel's pick for
/// port 0) was once taken in between by a socket of another test running
/// at the same time. Each test process starts at its own offset. (Below
/// 25000 `tools/tests/perf_quic.rs` binds fixed ports.)
pub fn loopback_addrs(n: usize) -> Vec<std::net::SocketAddrV4> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 25_000;
    const SPAN: u32 = 7_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id() * 37) % SPAN,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    let mut held = Vec::new();
    while held.len() < n {
        let port = LOW + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN;
        if let Ok(s) = std::net::UdpSocket::bind(("127.0.0.1", port as u16)) {
            held.push(s);
        }
    }
    held.iter()
        .map(|s| match s.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        })
        .collect()
}
