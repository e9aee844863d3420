//! The i16 + per-chunk-scale gradient codec on the GPU, compiled at run time
//! with NVRTC. Bit-compatible with the CPU codec (collectives): same absmax,
//! IEEE divisions for scale and inverse, round-half-even or seeded
//! stochastic rounding, error feedback, and dequantize/accumulate with the
//! multiply and the add rounded separately (never fused into an FMA).

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use crate::error::{Error, Result};
use crate::gpu::Gpu;

const SOURCE: &str = include_str!("codec.cu");
/// Threads per block (one block per chunk). Must match codec.cu's shared
/// reduction array.
const THREADS: u32 = 256;
/// Largest chunk the wire format allows.
pub const MAX_CHUNK: usize = 65535;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// Round half to even.
    Nearest,
    /// floor(x * inv + u) with u from MurmurHash3's finalizer of
    /// `seed ^ (i * 0x9E3779B9)`, i the index within the chunk.
    Stochastic { seed: u32 },
}

/// The compiled kernels on one stream.
pub struct GpuCodec {
    stream: Arc<CudaStream>,
    f: Kernels,
}

struct Kernels {
    absmax_plain: CudaFunction,
    absmax_residual: CudaFunction,
    quantize_nearest: CudaFunction,
    quantize_nearest_residual: CudaFunction,
    quantize_stochastic: CudaFunction,
    quantize_stochastic_residual: CudaFunction,
    dequantize: CudaFunction,
    dequantize_accumulate: CudaFunction,
}

impl GpuCodec {
    /// Compile the kernels for `gpu` (NVRTC must be installed: libnvrtc).
    pub fn new(gpu: &Gpu) -> Result<GpuCodec> {
        let ctx = gpu.require("the GPU codec")?;
        // SAFETY: only tries to dlopen libnvrtc under its usual names.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::Nvrtc(
                "libnvrtc.so not found: install the CUDA NVRTC runtime (cuda-nvrtc) or add it to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        let opts = CompileOptions {
            fmad: Some(false),
            prec_div: Some(true),
            ftz: Some(false),
            name: Some("ainftp_codec.cu".into()),
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(SOURCE, opts).map_err(|e| Error::Nvrtc(e.to_string()))?;
        let module = ctx.load_module(ptx)?;
        let load = |name: &str| module.load_function(name);
        let f = Kernels {
            absmax_plain: load("absmax_plain")?,
            absmax_residual: load("absmax_residual")?,
            quantize_nearest: load("quantize_nearest")?,
            quantize_nearest_residual: load("quantize_nearest_residual")?,
            quantize_stochastic: load("quantize_stochastic")?,
            quantize_stochastic_residual: load("quantize_stochastic_residual")?,
            dequantize: load("dequantize")?,
            dequantize_accumulate: load("dequantize_accumulate")?,
        };
        Ok(GpuCodec {
            stream: ctx.new_stream()?,
            f,
        })
    }

    /// The stream every kernel runs on (in order).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Quantize `x` chunk by chunk into `q` and one scale per chunk into
    /// `scales`. With `residual`, x + residual is quantized and the residual
    /// is replaced by what the rounding lost (error feedback).
    pub fn quantize(
        &self,
        x: &CudaSlice<f32>,
        residual: Option<&mut CudaSlice<f32>>,
        chunk: usize,
        rounding: Rounding,
        q: &mut CudaSlice<i16>,
        scales: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let n = x.len();
        let (cfg, chunks) = launch(n, chunk)?;
        check("q", q.len(), n)?;
        check("scales", scales.len(), chunks as usize)?;
        if let Some(r) = &residual {
            check("residual", r.len(), n)?;
        }
        if n == 0 {
            return Ok(());
        }
        let (n32, c32) = (n as u32, chunk as u32);
        let seed = match rounding {
            Rounding::Nearest => 0u32,
            Rounding::Stochastic { seed } => seed,
        };
        let mut absmax = self.stream.alloc_zeros::<f32>(chunks as usize)?;
        let quant = match (rounding, residual.is_some()) {
            (Rounding::Nearest, false) => &self.f.quantize_nearest,
            (Rounding::Nearest, true) => &self.f.quantize_nearest_residual,
            (Rounding::Stochastic { .. }, false) => &self.f.quantize_stochastic,
            (Rounding::Stochastic { .. }, true) => &self.f.quantize_stochastic_residual,
        };
        match residual {
            None => {
                let mut b = self.stream.launch_builder(&self.f.absmax_plain);
                b.arg(x).arg(&n32).arg(&c32).arg(&mut absmax);
                // SAFETY: the argument list matches absmax_plain's signature;
                // one block per chunk reads only its chunk of x.
                unsafe { b.launch(cfg) }?;
                let mut b = self.stream.launch_builder(quant);
                b.arg(x)
                    .arg(&n32)
                    .arg(&c32)
                    .arg(&absmax)
                    .arg(&seed)
                    .arg(q)
                    .arg(scales);
                // SAFETY: matches quantize_*(x, n, chunk, am, seed, q, s);
                // q holds n elements and scales one per chunk (checked).
                unsafe { b.launch(cfg) }?;
            }
            Some(r) => {
                let mut b = self.stream.launch_builder(&self.f.absmax_residual);
                b.arg(x).arg(&*r).arg(&n32).arg(&c32).arg(&mut absmax);
                // SAFETY: matches absmax_residual; r holds n elements.
                unsafe { b.launch(cfg) }?;
                let mut b = self.stream.launch_builder(quant);
                b.arg(x)
                    .arg(r)
                    .arg(&n32)
                    .arg(&c32)
                    .arg(&absmax)
                    .arg(&seed)
                    .arg(q)
                    .arg(scales);
                // SAFETY: matches quantize_*_residual(x, r, n, chunk, am,
                // seed, q, s); sizes checked above.
                unsafe { b.launch(cfg) }?;
            }
        }
        Ok(())
    }

    /// y = q * scale, chunk by chunk.
    pub fn dequantize(
        &self,
        q: &CudaSlice<i16>,
        scales: &CudaSlice<f32>,
        chunk: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        self.dequant(&self.f.dequantize, q, scales, chunk, y)
    }

    /// acc = acc + q * scale (multiply, then add), chunk by chunk.
    pub fn accumulate(
        &self,
        q: &CudaSlice<i16>,
        scales: &CudaSlice<f32>,
        chunk: usize,
        acc: &mut CudaSlice<f32>,
    ) -> Result<()> {
        self.dequant(&self.f.dequantize_accumulate, q, scales, chunk, acc)
    }

    fn dequant(
        &self,
        f: &CudaFunction,
        q: &CudaSlice<i16>,
        scales: &CudaSlice<f32>,
        chunk: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let n = q.len();
        let (cfg, chunks) = launch(n, chunk)?;
        check("output", out.len(), n)?;
        check("scales", scales.len(), chunks as usize)?;
        if n == 0 {
            return Ok(());
        }
        let (n32, c32) = (n as u32, chunk as u32);
        let mut b = self.stream.launch_builder(f);
        b.arg(q).arg(scales).arg(&n32).arg(&c32).arg(out);
        // SAFETY: matches dequantize*(q, scales, n, chunk, out); out holds n
        // elements and scales one per chunk (checked).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

/// One block per chunk.
fn launch(n: usize, chunk: usize) -> Result<(LaunchConfig, u32)> {
    if chunk == 0 || chunk > MAX_CHUNK {
        return Err(Error::InvalidArgument(format!(
            "chunk of {chunk} elements: it must be 1..={MAX_CHUNK}"
        )));
    }
    if n > u32::MAX as usize {
        return Err(Error::InvalidArgument(format!(
            "{n} elements: split buckets above 2^32 elements"
        )));
    }
    let chunks = n.div_ceil(chunk);
    if chunks > i32::MAX as usize {
        return Err(Error::InvalidArgument(format!(
            "{chunks} chunks exceed CUDA's grid: use larger chunks"
        )));
    }
    let chunks = chunks as u32;
    Ok((
        LaunchConfig {
            grid_dim: (chunks.max(1), 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        },
        chunks,
    ))
}

fn check(what: &str, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(Error::InvalidArgument(format!(
            "{what} holds {have} elements, {need} needed"
        )));
    }
    Ok(())
}
