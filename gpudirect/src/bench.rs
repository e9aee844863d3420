//! The measurements of `ainftp-perf gpu`: host <-> device copy bandwidth
//! from the registered hugepage arena against CUDA's own page-locked
//! memory (cuMemHostAlloc, the link's pinned limit) and pageable memory;
//! the codec kernels' throughput against a device-to-device copy of the
//! same bytes. Timed with CUDA events on one stream. Needs a GPU.

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaSlice, CudaStream};

use crate::codec::{GpuCodec, Rounding};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::{Align, Arena, MemOptions};

/// One copy measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyRate {
    /// "arena" (registered hugepages), "pinned" (cuMemHostAlloc) or
    /// "pageable" (ordinary heap memory).
    pub source: &'static str,
    /// "h2d" or "d2h".
    pub direction: &'static str,
    pub bytes: usize,
    pub gb_per_s: f64,
}

/// The codec kernels against a device copy of the same f32 bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct CodecRate {
    pub elements: usize,
    /// f32 bytes per second through quantize then accumulate.
    pub quantize_accumulate_gb_per_s: f64,
    pub quantize_gb_per_s: f64,
    pub accumulate_gb_per_s: f64,
    /// cuMemcpyDtoD of the same f32 bytes.
    pub d2d_copy_gb_per_s: f64,
}

/// Elements per codec chunk in the measurements (the CPU codec's default).
const CHUNK: usize = 4096;

fn timing_event(ctx: &Arc<CudaContext>) -> Result<CudaEvent> {
    Ok(ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?)
}

/// Runs `op` `iters` times on `stream` between two events; GB/s for
/// `bytes` per run.
fn timed(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    bytes: usize,
    iters: usize,
    mut op: impl FnMut() -> Result<()>,
) -> Result<f64> {
    // One untimed run: first-touch costs (page tables, lazy mappings).
    op()?;
    let (start, end) = (timing_event(ctx)?, timing_event(ctx)?);
    start.record(stream)?;
    for _ in 0..iters {
        op()?;
    }
    end.record(stream)?;
    let ms = f64::from(start.elapsed_ms(&end)?);
    Ok(bytes as f64 * iters as f64 / (ms / 1e3) / 1e9)
}

/// Copy bandwidth each way from the three kinds of host memory.
pub fn copy_rates(gpu: &Gpu, bytes: usize, iters: usize) -> Result<Vec<CopyRate>> {
    let ctx = gpu.require("copy bandwidth")?;
    if bytes == 0 || iters == 0 {
        return Err(Error::InvalidArgument(
            "bytes and iterations must be positive".into(),
        ));
    }
    let stream = ctx.new_stream()?;
    let mut dev: CudaSlice<u8> = stream.alloc_zeros(bytes)?;

    let arena = Arena::new(bytes, &MemOptions::default())?;
    let _registered = gpu.register_host(arena.memory().clone())?;
    let mut region = arena.alloc(bytes, Align::Page4K)?;
    region.as_mut_slice().fill(1);
    // SAFETY: the allocation is filled before any read; it is only used
    // through cudarc's stream-synchronised copies below.
    let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }?;
    let mut pageable = vec![1u8; bytes];

    let mut rates = Vec::new();
    let both = |source: &'static str, rates: &mut Vec<CopyRate>, h2d: f64, d2h: f64| {
        rates.push(CopyRate {
            source,
            direction: "h2d",
            bytes,
            gb_per_s: h2d,
        });
        rates.push(CopyRate {
            source,
            direction: "d2h",
            bytes,
            gb_per_s: d2h,
        });
    };
    let h2d = timed(ctx, &stream, bytes, iters, || {
        Ok(stream.memcpy_htod(region.as_slice(), &mut dev)?)
    })?;
    let d2h = timed(ctx, &stream, bytes, iters, || {
        Ok(stream.memcpy_dtoh(&dev, region.as_mut_slice())?)
    })?;
    both("arena", &mut rates, h2d, d2h);
    let h2d = timed(ctx, &stream, bytes, iters, || {
        Ok(stream.memcpy_htod(&pinned, &mut dev)?)
    })?;
    let d2h = timed(ctx, &stream, bytes, iters, || {
        Ok(stream.memcpy_dtoh(&dev, &mut pinned)?)
    })?;
    both("pinned", &mut rates, h2d, d2h);
    let h2d = timed(ctx, &stream, bytes, iters, || {
        Ok(stream.memcpy_htod(&pageable, &mut dev)?)
    })?;
    let d2h = timed(ctx, &stream, bytes, iters, || {
        Ok(stream.memcpy_dtoh(&dev, &mut pageable)?)
    })?;
    both("pageable", &mut rates, h2d, d2h);
    stream.synchronize()?;
    Ok(rates)
}

/// Codec kernel throughput on `elements` f32 values.
pub fn codec_rate(gpu: &Gpu, elements: usize, iters: usize) -> Result<CodecRate> {
    let ctx = gpu.require("codec throughput")?;
    if elements == 0 || iters == 0 {
        return Err(Error::InvalidArgument(
            "elements and iterations must be positive".into(),
        ));
    }
    let codec = GpuCodec::new(gpu)?;
    let stream = codec.stream().clone();
    let host: Vec<f32> = (0..elements)
        .map(|i| ((i % 251) as f32 - 125.0) * 0.01)
        .collect();
    let x = stream.clone_htod(&host)?;
    let mut acc: CudaSlice<f32> = stream.alloc_zeros(elements)?;
    let mut copy: CudaSlice<f32> = stream.alloc_zeros(elements)?;
    let mut q: CudaSlice<i16> = stream.alloc_zeros(elements)?;
    let mut scales: CudaSlice<f32> = stream.alloc_zeros(elements.div_ceil(CHUNK))?;
    let bytes = elements * 4;
    let quantize = timed(ctx, &stream, bytes, iters, || {
        codec.quantize(&x, None, CHUNK, Rounding::Nearest, &mut q, &mut scales)
    })?;
    let accumulate = timed(ctx, &stream, bytes, iters, || {
        codec.accumulate(&q, &scales, CHUNK, &mut acc)
    })?;
    let both = timed(ctx, &stream, bytes, iters, || {
        codec.quantize(&x, None, CHUNK, Rounding::Nearest, &mut q, &mut scales)?;
        codec.accumulate(&q, &scales, CHUNK, &mut acc)
    })?;
    let d2d = timed(ctx, &stream, bytes, iters, || {
        Ok(stream.memcpy_dtod(&x, &mut copy)?)
    })?;
    stream.synchronize()?;
    Ok(CodecRate {
        elements,
        quantize_accumulate_gb_per_s: both,
        quantize_gb_per_s: quantize,
        accumulate_gb_per_s: accumulate,
        d2d_copy_gb_per_s: d2d,
    })
}
