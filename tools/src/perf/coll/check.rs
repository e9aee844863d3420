//! Known inputs and their reference results: rank r fills element i with
//! `value(r, i)` (multiples of 1/4 in [-8, 8), exact in f32, so every rank
//! computes the expected result itself), plus the engine's documented
//! i16 error bound for the tolerance.

use collectives::shard_range;

use crate::perf::args::{CollCodec, CollDtype, CollOp, Mode, PerfArgs};

/// Input of rank `r` at element `i`.
pub fn value(r: usize, i: usize) -> f32 {
    ((i * 7 + r * 13) % 64) as f32 * 0.25 - 8.0
}

/// Bytes per element of `dtype`.
pub fn elem_bytes(dtype: CollDtype) -> u64 {
    match dtype {
        CollDtype::F32 => 4,
        CollDtype::Bf16 => 2,
    }
}

/// Largest |value|.
const ABSMAX: f32 = 8.0;

/// What this rank's buffer holds before the collective.
pub fn fill(mode: Mode, rank: usize, world: usize, buf: &mut [f32]) {
    let n = buf.len();
    match mode {
        Mode::Allgather => {
            buf.fill(0.0);
            for i in shard_range(n, world, rank) {
                buf[i] = value(rank, i);
            }
        }
        Mode::Broadcast if rank != 0 => buf.fill(0.0),
        _ => {
            for (i, x) in buf.iter_mut().enumerate() {
                *x = value(rank, i);
            }
        }
    }
}

/// The elements this rank's result is defined on.
pub fn result_range(mode: Mode, rank: usize, world: usize, n: usize) -> std::ops::Range<usize> {
    match mode {
        Mode::ReduceScatter => shard_range(n, world, rank),
        _ => 0..n,
    }
}

fn reference(mode: Mode, op: CollOp, world: usize, n: usize, i: usize) -> f32 {
    match mode {
        Mode::Allgather => {
            let owner = (0..world)
                .find(|&r| shard_range(n, world, r).contains(&i))
                .unwrap_or(0);
            value(owner, i)
        }
        Mode::Broadcast => value(0, i),
        _ => {
            let vals = (0..world).map(|r| value(r, i));
            match op {
                CollOp::Sum => vals.sum(),
                CollOp::Avg => vals.sum::<f32>() / world as f32,
                CollOp::Max => vals.fold(f32::MIN, f32::max),
                CollOp::Min => vals.fold(f32::MAX, f32::min),
            }
        }
    }
}

/// Allowed |error| per element: f32 1e-6 relative; i16 the engine's bound
/// `Q·e·A/32767 + (N-1)·2^-24·A` with `Q = 2N` (the longest path, recursive
/// doubling), `e = 0.51` (nearest), `A = N·absmax` (crate docs); bf16
/// adds its one rounding of the result: 2^-8 of the result's magnitude.
pub fn tolerance(args: &PerfArgs, world: usize, reference: f32) -> f32 {
    let f32_result = f32_tolerance(args.mode, args.op, args.codec, world, reference);
    match args.dtype {
        CollDtype::F32 => f32_result,
        CollDtype::Bf16 => f32_result + (reference.abs() + f32_result) / 256.0,
    }
}

/// `tolerance` of the f32 result, before any rounding to the dtype.
fn f32_tolerance(mode: Mode, op: CollOp, codec: CollCodec, world: usize, reference: f32) -> f32 {
    let exact = 1e-6 * reference.abs().max(1.0);
    if codec == CollCodec::F32 {
        return exact;
    }
    let n = world as f32;
    let bound = match mode {
        Mode::Allgather | Mode::Broadcast => 0.51 * ABSMAX / 32767.0,
        _ => {
            let a = n * ABSMAX;
            let q = 2.0 * n;
            let quant = q * 0.51 * a / 32767.0;
            let sum_err = (n - 1.0) * a / 16_777_216.0;
            match op {
                CollOp::Sum => quant + sum_err,
                CollOp::Avg => (quant + sum_err) / n,
                CollOp::Max | CollOp::Min => quant,
            }
        }
    };
    bound + exact
}

/// Checks `buf` (after the collective): (max relative error with a floor
/// of 1 on the magnitude, elements out of tolerance).
pub fn check(args: &PerfArgs, rank: usize, world: usize, buf: &[f32]) -> (f64, u64) {
    let (mode, op) = (args.mode, args.op);
    let n = buf.len();
    let mut max_rel = 0f64;
    let mut wrong = 0;
    for i in result_range(mode, rank, world, n) {
        let want = reference(mode, op, world, n, i);
        let err = (buf[i] - want).abs();
        let rel = f64::from(err) / f64::from(want.abs().max(1.0));
        if rel > max_rel || rel.is_nan() {
            max_rel = if rel.is_nan() { f64::INFINITY } else { rel };
        }
        // NaN counts as wrong.
        if err.is_nan() || err > tolerance(args, world, want) {
            wrong += 1;
        }
    }
    (max_rel, wrong)
}

/// FNV-1a over the result's bytes: equal hashes across ranks mean
/// bit-identical results.
pub fn hash(buf: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in buf {
        for b in x.to_bits().to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}
