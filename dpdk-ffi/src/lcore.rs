//! Running closures on EAL lcores, and the ids of the current thread.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use crate::eal::Eal;
use crate::error::{dpdk, Error, Result};
use crate::sys;

/// The EAL lcore id of the calling thread, if it is an EAL thread.
pub fn current() -> Option<u32> {
    // SAFETY: reads a thread-local; valid on any thread.
    let id = unsafe { sys::ainftp_lcore_id() };
    (id < sys::RTE_MAX_LCORE).then_some(id)
}

/// The NUMA socket of the calling thread.
pub fn socket_id() -> u32 {
    // SAFETY: reads a thread-local; valid on any thread.
    unsafe { sys::rte_socket_id() }
}

/// The CPU an lcore is pinned to. (`_eal` proves EAL is initialised.)
pub fn cpu_of(_eal: &Eal, lcore: u32) -> Option<u32> {
    // SAFETY: EAL is initialised; any id is accepted.
    let cpu = unsafe { sys::rte_lcore_to_cpu_id(lcore as i32) };
    (cpu >= 0).then_some(cpu as u32)
}

/// Pin the calling (non-EAL) thread to one CPU. EAL lcores are pinned by EAL.
pub fn pin_current_thread(cpu: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
}

/// A spin-wait hint to the CPU.
#[inline]
pub fn pause() {
    // SAFETY: a CPU hint with no preconditions.
    unsafe { sys::ainftp_pause() }
}

/// Where a launched closure leaves its result.
pub struct LcoreJoin<R> {
    lcore: u32,
    slot: Arc<Mutex<Option<R>>>,
}

/// What crosses the C boundary: a thin pointer to the boxed closure.
type Job = Box<dyn FnOnce() + Send>;

unsafe extern "C" fn trampoline(arg: *mut std::ffi::c_void) -> i32 {
    // SAFETY: arg is the Box<Job> leaked by launch, received exactly once.
    let job = unsafe { Box::from_raw(arg as *mut Job) };
    // Unwinding across the C frame would abort; report it instead.
    match catch_unwind(AssertUnwindSafe(*job)) {
        Ok(()) => 0,
        Err(_) => -1,
    }
}

/// Run `f` on worker lcore `lcore` (not the main lcore: run that on the
/// main thread). Join to wait for it and get its result.
pub fn launch<F, R>(eal: &Eal, lcore: u32, f: F) -> Result<LcoreJoin<R>>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    if lcore == eal.main_lcore() {
        return Err(Error::InvalidArgument(format!(
            "lcore {lcore} is the main lcore; run its work on the main thread"
        )));
    }
    if !eal.worker_lcores().contains(&lcore) {
        return Err(Error::InvalidArgument(format!(
            "lcore {lcore} is not enabled (EAL lcores: {:?})",
            eal.worker_lcores()
        )));
    }
    let slot = Arc::new(Mutex::new(None));
    let out = slot.clone();
    let job: Box<Job> = Box::new(Box::new(move || {
        let r = f();
        *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    }));
    let arg = Box::into_raw(job) as *mut std::ffi::c_void;
    // SAFETY: trampoline matches lcore_function_t and takes ownership of
    // arg exactly once when the launch succeeds.
    let rc = unsafe { sys::rte_eal_remote_launch(Some(trampoline), arg, lcore) };
    if rc < 0 {
        // SAFETY: not launched, so arg is still ours to free.
        drop(unsafe { Box::from_raw(arg as *mut Job) });
        return Err(dpdk("rte_eal_remote_launch (lcore busy?)", rc));
    }
    Ok(LcoreJoin { lcore, slot })
}

impl<R> LcoreJoin<R> {
    pub fn lcore(&self) -> u32 {
        self.lcore
    }

    /// Wait for the closure to return.
    pub fn join(self) -> Result<R> {
        // SAFETY: the lcore was launched by us; waiting is always valid.
        unsafe { sys::rte_eal_wait_lcore(self.lcore) };
        self.slot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or(Error::LcorePanicked(self.lcore))
    }
}
