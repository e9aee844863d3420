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
    } else if given("--file-prefix")
        && !given("--huge-unlink")
        && !given("--proc-type")
        && !given("--single-file-segments")
        && !given("--no-huge")
    {
        // With a prefix (memif between two processes) the hugepage files
        // would outlive us and keep their pages; no secondary process of
        // ours needs them. (EAL refuses it beside --single-file-segments,
        // which memif's zero-copy mode wants, and beside --no-huge: then
        // the files stay, as with testpmd. --huge-unlink=never keeps them
        // for secondary processes such as dpdk-pdump.)
        args.push("--huge-unlink".into());
    }
    // EAL is chatty at info level; warnings and errors still show.
    args.push("--log-level=*:warning".into());
    args.extend(opts.extra.iter().cloned());
    args
}

/// A PCI address as EAL takes it, `0000:3b:00.0` or `3b:00.7` (hex
/// domain of 4-8 digits, bus, device, a function digit 0-7), optionally
/// followed by device arguments (`,mprq_en=1`); checked before EAL runs,
/// whose own answer to a malformed one is "No such device".
pub fn parse_pci(s: &str) -> std::result::Result<String, String> {
    let bad = || format!("'{s}' is not a PCI address like 0000:3b:00.0");
    let hex = |part: &str, len: std::ops::RangeInclusive<usize>| {
        len.contains(&part.len()) && part.chars().all(|c| c.is_ascii_hexdigit())
    };
    let address = s.split(',').next().unwrap_or_default();
    let parts: Vec<&str> = address.split(':').collect();
    let (bus, rest) = match parts.as_slice() {
        [domain, bus, rest] if hex(domain, 4..=8) => (*bus, *rest),
        [bus, rest] => (*bus, *rest),
        _ => return Err(bad()),
    };
    let (dev, func) = rest.split_once('.').ok_or_else(bad)?;
    let func_ok = matches!(func.as_bytes(), [b'0'..=b'7']);
    // A bus has 32 devices (5 bits of the address).
    let dev_ok = hex(dev, 2..=2) && u8::from_str_radix(dev, 16).is_ok_and(|d| d <= 0x1f);
    if hex(bus, 2..=2) && dev_ok && func_ok {
        Ok(s.to_owned())
    } else {
        Err(bad())
    }
}

/// Validate the lcores, then start the EAL.
pub fn init(opts: &EalOptions) -> Result<Eal> {
    cpulist::check_online(opts.lcores)?;
    Ok(Eal::init(eal_args(opts))?)
}

/// The default lcore list: the first two CPUs this process may run on
/// (main + one worker).
pub fn default_lcores() -> Result<Vec<u32>> {
    Ok(cpulist::usable_cpus()?.into_iter().take(2).collect())
}

#[cfg(test)]
mod tests {
    use super::{eal_args, parse_pci, EalOptions};

    fn args_with(extra: &[&str]) -> Vec<String> {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        eal_args(&EalOptions {
            lcores: &[0],
            pci: &[],
            extra: &extra,
        })
    }

    #[test]
    fn shared_files_only_on_request_and_unlinked_where_eal_allows() {
        assert!(args_with(&[]).contains(&"--in-memory".to_string()));
        let prefixed = args_with(&["--file-prefix", "a"]);
        assert!(!prefixed.contains(&"--in-memory".to_string()));
        assert!(prefixed.contains(&"--huge-unlink".to_string()));
        for other in [
            "--single-file-segments",
            "--proc-type=secondary",
            "--huge-unlink=never",
        ] {
            let args = args_with(&["--file-prefix", "a", other]);
            assert!(
                !args.contains(&"--huge-unlink".to_string()),
                "{other}: {args:?}"
            );
        }
    }

    #[test]
    fn pci_addresses_are_checked_before_eal_sees_them() {
        for good in [
            "0000:3b:00.0",
            "3b:00.7",
            "ABCD:ff:1f.3",
            "10000:01:00.0",
            "0000:3b:00.0,mprq_en=1",
        ] {
            assert_eq!(parse_pci(good).as_deref(), Ok(good));
        }
        for bad in [
            "zzz",
            "",
            "0000:3b:00",
            "0000:3b:00.8",
            "00:3b:00.0",
            "3b:0.0",
            "0000:3b:00.0.1",
            "3b:ff.0",
            "0000:3b:20.0",
        ] {
            assert!(parse_pci(bad).is_err(), "{bad:?} accepted");
        }
    }
}
