//! i16 quantize + accumulate throughput per core against memcpy of the same
//! f32 bytes, for every instruction set this CPU has, in cache and out of
//! cache. Run: `cargo bench -p collectives --bench codec_throughput`.
//!
//! "q+acc" is the separate kernels: the sender quantizes a 64 KiB chunk
//! (absmax pass + quantize pass) and the receiver dequantizes and adds the
//! payload into its f32 accumulator. "hop" is what a ring hop of the i16
//! data plane runs per chunk: fold the received payload into the
//! accumulator while measuring its absmax (`accumulate_absmax`), then
//! quantize the partial sum it forwards with that absmax
//! (`quantize_with_absmax`), chunk by chunk so the second pass hits cache.
//! Throughput counts f32 bytes (4 per element); the peer is memcpy of
//! those bytes (`copy_from_slice`), measured in the same run.

use std::hint::black_box;
use std::time::{Duration, Instant};

use collectives::codec::Isa;
use collectives::Rounding;

const CHUNK: usize = 16 * 1024;

fn best_of(reps: usize, mut f: impl FnMut()) -> Duration {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .expect("reps > 0")
}

fn main() {
    let sizes = [(256 * 1024, "256 KiB (L2)"), (64 << 20, "64 MiB (DRAM)")];
    println!(
        "{:<14} {:<8} {:<10} {:>12} {:>12} {:>12} {:>12} {:>7} {:>9} {:>7}",
        "buffer",
        "isa",
        "rounding",
        "memcpy GB/s",
        "quant GB/s",
        "accum GB/s",
        "q+acc GB/s",
        "ratio",
        "hop GB/s",
        "ratio"
    );
    for (bytes, label) in sizes {
        let n = bytes / 4;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 10007) as f32 / 10007.0 - 0.5)
            .collect();
        let mut dst = vec![0f32; n];
        let mut acc = vec![0f32; n];
        let mut payload = vec![0u8; 2 * n];
        let mut forward = vec![0u8; 2 * n];
        let mut scales = vec![0f32; n.div_ceil(CHUNK)];
        let reps = if n > 1 << 20 { 5 } else { 200 };
        let gbs = |d: Duration| (4 * n) as f64 / d.as_secs_f64() / 1e9;
        let t_copy = best_of(reps, || {
            dst.copy_from_slice(black_box(&x));
            black_box(&dst);
        });
        for isa in Isa::available() {
            for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                let mut quant = || {
                    for (c, (xc, pc)) in x
                        .chunks(CHUNK)
                        .zip(payload.chunks_mut(2 * CHUNK))
                        .enumerate()
                    {
                        scales[c] = isa
                            .quantize(black_box(xc), rounding, c as u32, pc)
                            .expect("finite input");
                    }
                };
                let t_q = best_of(reps, &mut quant);
                let mut accum = || {
                    for (c, (ac, pc)) in acc
                        .chunks_mut(CHUNK)
                        .zip(payload.chunks(2 * CHUNK))
                        .enumerate()
                    {
                        isa.accumulate(ac, black_box(pc), scales[c], f32::INFINITY);
                    }
                };
                let t_a = best_of(reps, &mut accum);
                let t_qa = t_q + t_a;
                // A ring hop: fold the received chunk, then quantize the
                // partial sum for the next rank while it is in cache. The
                // accumulator is reset first so that it does not grow.
                acc.copy_from_slice(&x);
                let t_hop = best_of(reps, || {
                    for (c, ((ac, pc), fc)) in acc
                        .chunks_mut(CHUNK)
                        .zip(payload.chunks(2 * CHUNK))
                        .zip(forward.chunks_mut(2 * CHUNK))
                        .enumerate()
                    {
                        let m = isa
                            .accumulate_absmax(ac, black_box(pc), scales[c] * 1e-6, f32::INFINITY)
                            .expect("finite sums");
                        isa.quantize_with_absmax(ac, m, rounding, c as u32, fc)
                            .expect("chunk fits");
                    }
                    black_box(&forward);
                });
                println!(
                    "{:<14} {:<8} {:<10} {:>12.2} {:>12.2} {:>12.2} {:>12.2} {:>7.2} {:>9.2} {:>7.2}",
                    label,
                    isa.name(),
                    format!("{rounding:?}").to_lowercase(),
                    gbs(t_copy),
                    gbs(t_q),
                    gbs(t_a),
                    gbs(t_qa),
                    t_copy.as_secs_f64() / t_qa.as_secs_f64(),
                    gbs(t_hop),
                    t_copy.as_secs_f64() / t_hop.as_secs_f64()
                );
            }
        }
        black_box((&dst, &acc));
    }
    println!(
        "ratio = memcpy time / (quantize + accumulate time) for the same f32 bytes; target >= 0.8"
    );
    println!(
        "hop = fold with absmax, then quantize the partial sum, chunk by chunk (64 KiB), as a ring hop does; ratio = memcpy time / hop time"
    );
}
