//! Finding a GPU at run time. libcuda is loaded with dlopen (cudarc's
//! dynamic loading), so the crate builds and runs without CUDA; with no
//! driver or no device the process runs host-only.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Once};

use cudarc::driver::{sys, CudaContext};

use crate::error::{Error, Result};
use crate::hugemem::HugeMem;

/// A CUDA device, or host-only mode. Cheap to clone.
#[derive(Clone)]
pub struct Gpu {
    ctx: Option<Arc<CudaContext>>,
}

static HOST_ONLY_NOTE: Once = Once::new();

impl Gpu {
    /// Device 0, or host-only.
    pub fn probe() -> Gpu {
        Gpu::probe_device(0)
    }

    /// Device `ordinal`, or host-only when the driver library is missing,
    /// too old, has no device, or fails to initialise.
    pub fn probe_device(ordinal: usize) -> Gpu {
        Gpu::open_device(ordinal).unwrap_or_else(|why| {
            HOST_ONLY_NOTE.call_once(
                || tracing::info!(reason = %why, "no CUDA driver/GPU: running host-only"),
            );
            Gpu { ctx: None }
        })
    }

    /// Device `ordinal`, or why this machine is host-only.
    pub fn open_device(ordinal: usize) -> std::result::Result<Gpu, String> {
        let ctx = open(ordinal)?;
        let name = ctx.name().unwrap_or_default();
        tracing::info!(ordinal, %name, "CUDA device opened");
        Ok(Gpu { ctx: Some(ctx) })
    }

    /// Host-only mode, whatever the machine has.
    pub fn host_only() -> Gpu {
        Gpu { ctx: None }
    }

    pub fn is_host_only(&self) -> bool {
        self.ctx.is_none()
    }

    /// The CUDA context (None when host-only).
    pub fn context(&self) -> Option<&Arc<CudaContext>> {
        self.ctx.as_ref()
    }

    pub(crate) fn require(&self, what: &'static str) -> Result<&Arc<CudaContext>> {
        self.ctx.as_ref().ok_or(Error::NoGpu(what))
    }

    pub fn name(&self) -> Option<String> {
        self.ctx.as_ref().and_then(|c| c.name().ok())
    }

    /// Page-lock `mem` for the GPU (cuMemHostRegister with PORTABLE and
    /// DEVICEMAP), so copies from it are true async DMA and kernels can
    /// read it through a device pointer. Host-only: a registration that
    /// does nothing.
    pub fn register_host(&self, mem: Arc<HugeMem>) -> Result<HostRegistration> {
        let Some(ctx) = &self.ctx else {
            return Ok(HostRegistration { mem, ctx: None });
        };
        ctx.bind_to_thread()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the range is one live mapping that `HostRegistration`
        // keeps alive until it unregisters it.
        unsafe { sys::cuMemHostRegister_v2(mem.as_ptr().cast(), mem.len(), flags) }.result()?;
        Ok(HostRegistration {
            mem,
            ctx: Some(ctx.clone()),
        })
    }
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.ctx {
            Some(c) => write!(f, "Gpu({})", c.ordinal()),
            None => write!(f, "Gpu(host-only)"),
        }
    }
}

/// The oldest driver (cuDriverGetVersion: 1000 * major + 10 * minor) we
/// open. cudarc resolves each entry point at its first call and panics
/// when the library lacks it, which under the release profile's
/// `panic = "abort"` ends the process: so the driver is checked first.
const MIN_DRIVER_VERSION: i32 = 12000;

fn open(ordinal: usize) -> std::result::Result<Arc<CudaContext>, String> {
    // SAFETY: only tries to dlopen libcuda under its usual names.
    if !unsafe { sys::is_culib_present() } {
        return Err("libcuda.so not found".into());
    }
    let version = driver_version()?;
    if version < MIN_DRIVER_VERSION {
        return Err(format!(
            "the CUDA driver is version {}.{}; the GPU path needs {}.{} or newer",
            version / 1000,
            version % 1000 / 10,
            MIN_DRIVER_VERSION / 1000,
            MIN_DRIVER_VERSION % 1000 / 10
        ));
    }
    // A driver past the check that still lacks an entry point: host-only
    // where panics unwind (tests, dev builds); the release build aborts.
    std::panic::catch_unwind(AssertUnwindSafe(|| CudaContext::new(ordinal)))
        .map_err(|_| "the CUDA driver lacks a needed entry point".to_string())?
        .map_err(|e| e.to_string())
}

/// cuDriverGetVersion, looked up without cudarc's panicking loader.
fn driver_version() -> std::result::Result<i32, String> {
    // The result as a plain int: a library that is not a real driver may
    // return any value, which `CUresult` (an enum) cannot hold.
    type GetVersion = unsafe extern "C" fn(*mut std::ffi::c_int) -> std::ffi::c_int;
    // SAFETY: the library is present (checked by the caller, so culib()
    // does not panic); the symbol is looked up by name with the signature
    // cuda.h gives it (CUresult is a C enum, an int).
    let get = unsafe { sys::culib().get::<GetVersion>(b"cuDriverGetVersion\0") }
        .map_err(|_| "libcuda.so has no cuDriverGetVersion: not a CUDA driver".to_string())?;
    let mut version: std::ffi::c_int = 0;
    // SAFETY: a valid out-pointer, as the function's contract asks.
    match unsafe { get(&mut version) } {
        0 => Ok(version),
        // CUDA_ERROR_STUB_LIBRARY: the toolkit's stand-in, where no driver is.
        34 => Err("cuDriverGetVersion failed: CUDA_ERROR_STUB_LIBRARY (the toolkit's stub libcuda, no driver)".into()),
        e => Err(format!("cuDriverGetVersion failed: CUDA error {e}")),
    }
}

/// Memory registered with CUDA; unregistered on drop.
pub struct HostRegistration {
    mem: Arc<HugeMem>,
    ctx: Option<Arc<CudaContext>>,
}

impl HostRegistration {
    /// Whether CUDA knows the memory (false when host-only).
    pub fn is_registered(&self) -> bool {
        self.ctx.is_some()
    }

    pub fn memory(&self) -> &Arc<HugeMem> {
        &self.mem
    }

    /// The device's address for the host byte at `offset` (DEVICEMAP).
    pub fn device_ptr(&self, offset: usize) -> Result<sys::CUdeviceptr> {
        self.ctx
            .as_ref()
            .ok_or(Error::NoGpu("a device pointer to host memory"))?;
        if offset >= self.mem.len() {
            return Err(Error::InvalidArgument(format!(
                "offset {offset} is past the registered {} bytes",
                self.mem.len()
            )));
        }
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: the memory is registered with DEVICEMAP; dptr is a valid
        // out-pointer.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, self.mem.as_ptr().cast(), 0) }
            .result()?;
        Ok(dptr + offset as u64)
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if let Some(ctx) = &self.ctx {
            let _ = ctx.bind_to_thread();
            // SAFETY: registered in register_host with this base address.
            if let Err(e) = unsafe { sys::cuMemHostUnregister(self.mem.as_ptr().cast()) }.result() {
                tracing::warn!(error = %e, "cuMemHostUnregister failed");
            }
        }
    }
}
