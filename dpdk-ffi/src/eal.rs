//! The Environment Abstraction Layer: initialised once per process, cleaned
//! up when the last handle (held by every pool, port and ring) is dropped.

use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{from_rte_errno, Error, Result};
use crate::hugepages::HugepageStatus;
use crate::sys;

/// Set by the first init; DPDK cannot be initialised again after cleanup.
static INITIALISED: AtomicBool = AtomicBool::new(false);

/// A handle on the running EAL. Cheap to clone; rte_eal_cleanup runs when the
/// last clone is dropped.
#[derive(Clone)]
pub struct Eal {
    _inner: Arc<EalInner>,
}

struct EalInner {
    // rte_eal_init keeps pointers into argv (e.g. for devargs), so the
    // strings live as long as the EAL does.
    _args: Vec<CString>,
    /// The runtime directory of a primary process with its own
    /// `--file-prefix` (/var/run/dpdk/PREFIX); removed at cleanup, as
    /// nothing outlives us that could use it.
    runtime_dir: Option<std::path::PathBuf>,
}

impl Eal {
    /// Initialise DPDK with EAL arguments (without the program name), e.g.
    /// `["-l", "0-1", "--no-pci", "--in-memory"]`.
    pub fn init<I, S>(args: I) -> Result<Eal>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        if INITIALISED.swap(true, Ordering::SeqCst) {
            return Err(Error::AlreadyInitialised);
        }
        let mut owned = vec![CString::new("ainftp").unwrap()];
        for a in args {
            let a = a.as_ref();
            owned.push(CString::new(a).map_err(|_| {
                Error::InvalidArgument(format!("EAL argument {a:?} contains a NUL byte"))
            })?);
        }
        let uses_hugepages = !owned
            .iter()
            .any(|a| a.as_bytes() == b"--no-huge" || a.as_bytes() == b"--in-memory-no-huge");
        if uses_hugepages {
            // EAL's own message for this ("Cannot get hugepage information")
            // names no fix; check first and say what to do.
            if let Some(problem) = HugepageStatus::read().problem() {
                return Err(Error::NoHugepages(problem));
            }
        }
        let mut argv: Vec<*mut c_char> = owned.iter().map(|s| s.as_ptr() as *mut c_char).collect();
        // SAFETY: argv holds argc valid NUL-terminated strings that outlive
        // the EAL (kept in EalInner); INITIALISED guarantees one call per
        // process. EAL may permute argv's pointers, which is ours to lose.
        let rc = unsafe { sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
        if rc < 0 {
            return Err(from_rte_errno("rte_eal_init"));
        }
        // Only a directory of the caller's own prefix is removed: the
        // default one (/var/run/dpdk/rte) may belong to another primary
        // that runs beside us with --no-shconf.
        let given = |flag: &[u8]| owned.iter().any(|a| a.as_bytes().starts_with(flag));
        let own_prefix =
            given(b"--file-prefix") && !given(b"--in-memory") && !given(b"--no-shconf");
        // SAFETY: EAL is initialised; rte_eal_process_type only reads its config.
        let primary =
            unsafe { sys::rte_eal_process_type() } == sys::rte_proc_type_t_RTE_PROC_PRIMARY;
        let runtime_dir = (primary && own_prefix).then(|| {
            // SAFETY: EAL is initialised; the runtime dir is a NUL-terminated
            // string in EAL's static config, copied out at once.
            let dir = unsafe { CStr::from_ptr(sys::rte_eal_get_runtime_dir()) };
            std::path::PathBuf::from(dir.to_string_lossy().into_owned())
        });
        Ok(Eal {
            _inner: Arc::new(EalInner {
                _args: owned,
                runtime_dir,
            }),
        })
    }

    /// Whether an Eal was ever initialised in this process.
    pub fn is_initialised() -> bool {
        INITIALISED.load(Ordering::SeqCst)
    }

    pub fn main_lcore(&self) -> u32 {
        // SAFETY: EAL is initialised (we hold a handle).
        unsafe { sys::rte_get_main_lcore() }
    }

    pub fn lcore_count(&self) -> u32 {
        // SAFETY: EAL is initialised.
        unsafe { sys::rte_lcore_count() }
    }

    /// The enabled lcores other than the main one, in order.
    pub fn worker_lcores(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut id = u32::MAX; // -1: start from the first lcore
        loop {
            // SAFETY: EAL is initialised; rte_get_next_lcore accepts any i.
            id = unsafe { sys::rte_get_next_lcore(id, 1, 0) };
            if id >= sys::RTE_MAX_LCORE {
                return out;
            }
            out.push(id);
        }
    }

    /// The DPDK version string, e.g. "DPDK 22.11.11".
    pub fn version() -> String {
        // SAFETY: rte_version returns a pointer to a static string.
        unsafe { CStr::from_ptr(sys::rte_version()) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Drop for EalInner {
    fn drop(&mut self) {
        // SAFETY: the last handle is gone, so no pool, port or ring is left.
        unsafe { sys::rte_eal_cleanup() };
        if let Some(dir) = self.runtime_dir.as_ref().filter(|d| d.is_dir()) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
