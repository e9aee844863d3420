//! Turning the binaries' device and lcore flags into EAL arguments.

use dpdk_ffi::Eal;

use crate::cpulist;
use crate::error::Result;

pub struct EalOptions<'a> {
    pub lcores: &'a [u32],
    pub pci: &'a [String],
    /// Passed through unchanged, after ours (so they win).
    pub extra: &'a [String],
}

pub fn eal_args(opts: &EalOptions) -> Vec<String> {
    let mut args = vec!["-l".to_string(), cpulist::format_list(opts.lcores)];
    if opts.pci.is_empty() {
        args.push("--no-pci".into());
    } else {
        for bdf in opts.pci {
            args.extend(["-a".into(), bdf.clone()]);
        }
    }
    // Without a file prefix of the user's, run without shared files so that
    // several instances coexist and nothing is left in /dev/hugepages.
    let given = |flag: &str| opts.extra.iter().any(|a| a.starts_with(flag));
    if !given("--file-prefix") && !given("--in-memory") {
        args.push("--in-memory".into());
    } else if given("--file-prefix") && !given("--huge-unlink") && !given("--proc-type") {
        // With a prefix (memif between two processes) the hugepage files
        // would outlive us and keep their pages; no secondary process of
        // ours needs them.
        args.push("--huge-unlink".into());
    }
    // EAL is chatty at info level; warnings and errors still show.
    args.push("--log-level=*:warning".into());
    args.extend(opts.extra.iter().cloned());
    args
}

/// Validate the lcores, then start the EAL.
pub fn init(opts: &EalOptions) -> Result<Eal> {
    cpulist::check_online(opts.lcores)?;
    Ok(Eal::init(eal_args(opts))?)
}

/// The default lcore list: the first two online CPUs (main + one worker).
pub fn default_lcores() -> Result<Vec<u32>> {
    Ok(cpulist::online_cpus()?.into_iter().take(2).collect())
}
