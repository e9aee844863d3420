//! `ainftp-perf gpu`: what the GPU side of the data path can move. Copy
//! bandwidth from the registered hugepage arena against CUDA's own pinned
//! memory (the link's limit) and pageable memory, and the i16 codec
//! kernels against a device-to-device copy of the same bytes.

use gpudirect::bench::{codec_rate, copy_rates};
use gpudirect::Gpu;
use serde_json::json;

use crate::error::{Error, Result};
use crate::perf::args::PerfArgs;

pub fn run(args: &PerfArgs) -> Result<serde_json::Value> {
    let bytes = usize::try_from(args.bytes)
        .ok()
        .filter(|b| (4..=1 << 34).contains(b))
        .ok_or_else(|| {
            Error::Usage(format!("gpu: --bytes {} must be 4 B .. 16 GiB", args.bytes))
        })?;
    let iters = args.iters as usize;
    let gpu = Gpu::probe();
    if gpu.is_host_only() {
        return Err(Error::Usage(
            "gpu: no CUDA driver or GPU on this machine (host-only): nothing to measure".into(),
        ));
    }
    let name = gpu.name().unwrap_or_else(|| "?".into());
    let err = |e: gpudirect::Error| Error::Usage(format!("gpu: {e}"));
    let copies = copy_rates(&gpu, bytes, iters).map_err(err)?;
    let codec = codec_rate(&gpu, bytes / 4, iters).map_err(err)?;

    crate::oline!("# ainftp-perf gpu on {name}: {bytes} bytes, {iters} iterations, CUDA events");
    crate::oline!(
        "# {:>9} {:>5} {:>10} {:>16}",
        "source",
        "dir",
        "GB/s",
        "vs pinned"
    );
    let pinned = |dir: &str| {
        copies
            .iter()
            .find(|c| c.source == "pinned" && c.direction == dir)
            .map_or(f64::NAN, |c| c.gb_per_s)
    };
    for c in &copies {
        crate::oline!(
            "  {:>9} {:>5} {:>10.2} {:>15.2}x",
            c.source,
            c.direction,
            c.gb_per_s,
            c.gb_per_s / pinned(c.direction)
        );
    }
    crate::oline!(
        "# codec on {} f32: quantize {:.1} GB/s, accumulate {:.1} GB/s, both {:.1} GB/s; device copy {:.1} GB/s; ratio {:.2}",
        codec.elements,
        codec.quantize_gb_per_s,
        codec.accumulate_gb_per_s,
        codec.quantize_accumulate_gb_per_s,
        codec.d2d_copy_gb_per_s,
        codec.quantize_accumulate_gb_per_s / codec.d2d_copy_gb_per_s
    );
    Ok(json!({
        "mode": "gpu",
        "device": name,
        "bytes": bytes,
        "copies": copies.iter().map(|c| json!({
            "source": c.source, "direction": c.direction, "gb_per_s": c.gb_per_s,
        })).collect::<Vec<_>>(),
        "codec": {
            "elements": codec.elements,
            "quantize_gb_per_s": codec.quantize_gb_per_s,
            "accumulate_gb_per_s": codec.accumulate_gb_per_s,
            "quantize_accumulate_gb_per_s": codec.quantize_accumulate_gb_per_s,
            "d2d_copy_gb_per_s": codec.d2d_copy_gb_per_s,
        },
    }))
}
