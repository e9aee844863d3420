//! GPU tests: registration, DMA round trips and the codec kernels against
//! the scalar reference. Ignored by default (CI has no GPU, and they show
//! as not run there); run them with
//! `cargo nextest run -p gpudirect --run-ignored ignored-only`. Each one
//! fails at once if there is no GPU rather than passing without checking.

mod common;

use common::reference::{self, Mode};
use gpudirect::cudarc::driver::CudaSlice;
use gpudirect::{Align, Arena, DeviceMirror, Gpu, GpuCodec, MemOptions, Rounding};

fn gpu() -> Gpu {
    let gpu = Gpu::probe();
    assert!(
        !gpu.is_host_only(),
        "no CUDA driver/GPU here: these tests need an NVIDIA GPU"
    );
    gpu
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --run-ignored"]
fn the_arena_registers_with_cuda_and_maps_into_the_device() {
    let gpu = gpu();
    common::ensure_hugepages(32);
    let arena = Arena::new(64 << 20, &MemOptions::default()).unwrap();
    let reg = gpu.register_host(arena.memory().clone()).unwrap();
    assert!(reg.is_registered());
    let base = reg.device_ptr(0).unwrap();
    assert_ne!(base, 0);
    assert_eq!(reg.device_ptr(4096).unwrap(), base + 4096);
    assert!(reg.device_ptr(arena.capacity()).is_err());
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --run-ignored"]
fn dma_round_trips_are_byte_exact_from_1_byte_to_1_gib() {
    let gpu = gpu();
    const GIB: usize = 1 << 30;
    common::ensure_hugepages(2 * 512 + 8);
    let arena = Arena::new(2 * GIB, &MemOptions::default()).unwrap();
    let _reg = gpu.register_host(arena.memory().clone()).unwrap();
    let mut src = arena.alloc(GIB, Align::Page4K).unwrap();
    let mut dst = arena.alloc(GIB, Align::Page4K).unwrap();
    for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
        *b = (i as u32).wrapping_mul(2654435761).rotate_right(13) as u8;
    }
    let mut mirror = DeviceMirror::new(&gpu, GIB).unwrap();
    for (k, len) in [1usize, 3, 4096, 65537, 1 << 20, (64 << 20) + 5, GIB]
        .into_iter()
        .enumerate()
    {
        dst.as_mut_slice()[..len].fill(0);
        let up = mirror.upload(&src.as_slice()[..len]).unwrap();
        assert_eq!(up.slot(), k % 2);
        let slot = up.wait().unwrap();
        let down = mirror
            .download(slot, &mut dst.as_mut_slice()[..len], None)
            .unwrap();
        down.wait().unwrap();
        assert!(
            src.as_slice()[..len] == dst.as_slice()[..len],
            "round trip of {len} bytes differs"
        );
        mirror.release(slot, None).unwrap();
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --run-ignored"]
fn uploads_into_both_buffers_overlap_and_keep_their_own_bytes() {
    let gpu = gpu();
    common::ensure_hugepages(64);
    let arena = Arena::new(96 << 20, &MemOptions::default()).unwrap();
    let _reg = gpu.register_host(arena.memory().clone()).unwrap();
    let len = 32 << 20;
    let mut a = arena.alloc(len, Align::Page4K).unwrap();
    let mut b = arena.alloc(len, Align::Page4K).unwrap();
    let mut back = arena.alloc(len, Align::Page4K).unwrap();
    a.as_mut_slice().fill(0xa5);
    b.as_mut_slice().fill(0x5a);
    let mut mirror = DeviceMirror::new(&gpu, len).unwrap();
    let ta = mirror.upload(a.as_slice()).unwrap();
    let tb = mirror.upload(b.as_slice()).unwrap(); // queued behind ta
    let (sa, sb) = (ta.wait().unwrap(), tb.wait().unwrap());
    for (slot, fill) in [(sa, 0xa5u8), (sb, 0x5a)] {
        mirror
            .download(slot, back.as_mut_slice(), None)
            .unwrap()
            .wait()
            .unwrap();
        assert!(back.as_slice().iter().all(|&x| x == fill), "slot {slot}");
    }
}

/// Deterministic gradients with a spread of magnitudes, zero chunks and
/// exact ties.
fn gradients(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut x: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let mant = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            mant * 2f32.powi(((s >> 33) % 20) as i32 - 10)
        })
        .collect();
    if n > 300 {
        x[256..300].fill(0.0); // part of a chunk zero
    }
    x
}

fn to_dev<T: gpudirect::cudarc::driver::DeviceRepr>(codec: &GpuCodec, v: &[T]) -> CudaSlice<T> {
    codec.stream().clone_htod(v).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --run-ignored"]
fn codec_kernels_match_the_scalar_reference_bit_for_bit() {
    let gpu = gpu();
    let codec = GpuCodec::new(&gpu).unwrap();
    let s = codec.stream().clone();
    for &n in &[1usize, 1000, 100_003] {
        for &chunk in &[1usize, 255, 256, 4096, 65535] {
            for rounding in [
                Rounding::Nearest,
                Rounding::Stochastic { seed: 0xdead_beef },
            ] {
                for with_residual in [false, true] {
                    let what = format!("n={n} chunk={chunk} {rounding:?} residual={with_residual}");
                    let x = gradients(n, (n * 31 + chunk) as u64);
                    let r0: Vec<f32> = gradients(n, 99).iter().map(|v| v * 1e-3).collect();
                    let mode = match rounding {
                        Rounding::Nearest => Mode::Nearest,
                        Rounding::Stochastic { seed } => Mode::Stochastic(seed),
                    };
                    let mut q_ref = vec![0i16; n];
                    let mut r_ref = r0.clone();
                    let scales_ref = reference::quantize(
                        &x,
                        with_residual.then_some(&mut r_ref[..]),
                        chunk,
                        mode,
                        &mut q_ref,
                    );

                    let xd = to_dev(&codec, &x);
                    let mut rd = to_dev(&codec, &r0);
                    let mut qd = s.alloc_zeros::<i16>(n).unwrap();
                    let mut sd = s.alloc_zeros::<f32>(n.div_ceil(chunk)).unwrap();
                    codec
                        .quantize(
                            &xd,
                            with_residual.then_some(&mut rd),
                            chunk,
                            rounding,
                            &mut qd,
                            &mut sd,
                        )
                        .unwrap();
                    let q = s.clone_dtoh(&qd).unwrap();
                    let scales = s.clone_dtoh(&sd).unwrap();
                    assert_eq!(bits(&scales), bits(&scales_ref), "scales, {what}");
                    assert_eq!(q, q_ref, "q, {what}");
                    if with_residual {
                        assert_eq!(
                            bits(&s.clone_dtoh(&rd).unwrap()),
                            bits(&r_ref),
                            "residual, {what}"
                        );
                    }

                    let mut yd = s.alloc_zeros::<f32>(n).unwrap();
                    codec.dequantize(&qd, &sd, chunk, &mut yd).unwrap();
                    let y_ref = reference::dequantize(&q_ref, &scales_ref, chunk);
                    assert_eq!(
                        bits(&s.clone_dtoh(&yd).unwrap()),
                        bits(&y_ref),
                        "dequantize, {what}"
                    );

                    let acc0 = gradients(n, 7);
                    let mut accd = to_dev(&codec, &acc0);
                    codec.accumulate(&qd, &sd, chunk, &mut accd).unwrap();
                    let mut acc_ref = acc0.clone();
                    reference::accumulate(&mut acc_ref, &q_ref, &scales_ref, chunk);
                    assert_eq!(
                        bits(&s.clone_dtoh(&accd).unwrap()),
                        bits(&acc_ref),
                        "accumulate, {what}"
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --run-ignored"]
fn codec_rounds_ties_to_even_on_the_gpu() {
    let gpu = gpu();
    let codec = GpuCodec::new(&gpu).unwrap();
    let s = codec.stream().clone();
    let x = [32767.0f32, 0.5, 1.5, 2.5, -0.5, -2.5, -32767.0, 3.25];
    let xd = to_dev(&codec, &x);
    let mut qd = s.alloc_zeros::<i16>(8).unwrap();
    let mut sd = s.alloc_zeros::<f32>(1).unwrap();
    codec
        .quantize(&xd, None, 8, Rounding::Nearest, &mut qd, &mut sd)
        .unwrap();
    assert_eq!(
        s.clone_dtoh(&qd).unwrap(),
        vec![32767, 0, 2, 2, 0, -2, -32767, 3]
    );
    assert_eq!(s.clone_dtoh(&sd).unwrap(), vec![1.0]);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --run-ignored"]
fn bandwidth_and_codec_measurements_are_positive_and_complete() {
    let gpu = gpu();
    common::ensure_hugepages(64);
    let rates = gpudirect::bench::copy_rates(&gpu, 64 << 20, 5).unwrap();
    let mut seen: Vec<(&str, &str)> = rates.iter().map(|r| (r.source, r.direction)).collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("arena", "d2h"),
            ("arena", "h2d"),
            ("pageable", "d2h"),
            ("pageable", "h2d"),
            ("pinned", "d2h"),
            ("pinned", "h2d")
        ]
    );
    for r in &rates {
        assert!(r.gb_per_s.is_finite() && r.gb_per_s > 0.1, "{r:?}");
    }
    let c = gpudirect::bench::codec_rate(&gpu, 16 << 20, 5).unwrap();
    for v in [
        c.quantize_gb_per_s,
        c.accumulate_gb_per_s,
        c.quantize_accumulate_gb_per_s,
        c.d2d_copy_gb_per_s,
    ] {
        assert!(v.is_finite() && v > 1.0, "{c:?}");
    }
}
