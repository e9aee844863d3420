//! CPU / lcore lists in the DPDK and Linux syntax: "2-7", "0,2,4-5".

use std::collections::BTreeSet;

use crate::error::{Error, Result};

/// `parse` for the `--lcores` flag: errors name the flag.
pub fn parse_lcores_flag(list: &str) -> Result<Vec<u32>> {
    parse(list).map_err(|e| Error::Usage(format!("--lcores {list:?}: {e}")))
}

/// The most CPUs a list may name (ranges are capped at 4096 each; this
/// caps what repeated ones add up to).
const MAX_ENTRIES: usize = 1 << 16;

/// The CPUs of `list`, sorted, each once.
pub fn parse(list: &str) -> Result<Vec<u32>> {
    let mut cpus = parse_as_written(list)?;
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The CPUs of `list` in the order written ("7,2" is 7 then 2), for lists
/// whose order means something (lane k runs on the k-th); a CPU named
/// twice is an error.
pub fn parse_in_order(list: &str) -> Result<Vec<u32>> {
    let cpus = parse_as_written(list)?;
    let mut seen = BTreeSet::new();
    if let Some(twice) = cpus.iter().find(|&&c| !seen.insert(c)) {
        return Err(Error::Usage(format!(
            "lcore list '{list}' names CPU {twice} twice"
        )));
    }
    Ok(cpus)
}

fn parse_as_written(list: &str) -> Result<Vec<u32>> {
    let bad = |why: &str| {
        Error::Usage(format!(
            "malformed lcore list '{list}': {why}; use DPDK syntax such as 2-7 or 0,2,4-5"
        ))
    };
    let mut out = Vec::new();
    if list.trim().is_empty() {
        return Err(bad("it is empty"));
    }
    for part in list.trim().split(',') {
        let num = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| bad(&format!("'{s}' is not a number")))
        };
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (num(lo)?, num(hi)?);
                if lo > hi {
                    return Err(bad(&format!("range {lo}-{hi} runs backwards")));
                }
                if hi - lo > 4096 {
                    return Err(bad(&format!("range {lo}-{hi} is too large")));
                }
                out.extend(lo..=hi);
            }
            None => out.push(num(part)?),
        }
        if out.len() > MAX_ENTRIES {
            return Err(bad(&format!("it names more than {MAX_ENTRIES} CPUs")));
        }
    }
    Ok(out)
}

/// The CPUs the kernel has online.
pub fn online_cpus() -> Result<Vec<u32>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .map_err(|e| Error::Io("reading /sys/devices/system/cpu/online".into(), e))?;
    parse(text.trim())
}

/// The online CPUs this process may run on: a container's cpuset, a
/// cgroup or `taskset` may allow fewer than are online, and DPDK cannot
/// pin an lcore to any other.
pub fn usable_cpus() -> Result<Vec<u32>> {
    let online = online_cpus()?;
    let allowed = allowed_cpus();
    if allowed.is_empty() {
        return Ok(online);
    }
    Ok(online.into_iter().filter(|c| allowed.contains(c)).collect())
}

/// This process's CPU affinity (empty if it cannot be read).
fn allowed_cpus() -> Vec<u32> {
    let mut cpus: Vec<u32> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|c| u32::try_from(c.id).ok())
        .collect();
    cpus.sort_unstable();
    cpus
}

/// Check that every lcore is an online CPU this process may run on, with
/// an error that lists the ones it may use.
pub fn check_online(lcores: &[u32]) -> Result<()> {
    let online = online_cpus()?;
    if let Some(missing) = lcores.iter().find(|c| !online.contains(c)) {
        return Err(Error::Usage(format!(
            "lcore {missing} is not an online CPU of this machine (online: {}); choose the lcores among them",
            format_list(&online)
        )));
    }
    let usable = usable_cpus()?;
    if let Some(barred) = lcores.iter().find(|c| !usable.contains(c)) {
        return Err(Error::Usage(format!(
            "lcore {barred} is online, but this process may not run on it (its CPU affinity allows {}: a container, cgroup or taskset limits it); choose the lcores among those",
            format_list(&usable)
        )));
    }
    Ok(())
}

/// The compact form of a sorted list: [0,1,2,5] -> "0-2,5".
pub fn format_list(cpus: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        while i + 1 < cpus.len() && cpus[i + 1] == cpus[i] + 1 {
            i += 1;
        }
        parts.push(if cpus[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", cpus[i])
        });
        i += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranges_and_singles() {
        assert_eq!(parse("2-7").unwrap(), vec![2, 3, 4, 5, 6, 7]);
        assert_eq!(parse("0,2,4-5").unwrap(), vec![0, 2, 4, 5]);
        assert_eq!(parse("3,1,1").unwrap(), vec![1, 3]);
        assert_eq!(parse(" 0 - 1 ").unwrap(), vec![0, 1]);
    }

    #[test]
    fn rejects_garbage_with_the_syntax_in_the_message() {
        for bad in ["", "a", "1-", "-3", "5-2", "1,,2", "0-999999"] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("malformed lcore list") && e.contains("2-7"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn an_ordered_list_keeps_the_order_written_and_refuses_repeats() {
        assert_eq!(parse_in_order("7,2").unwrap(), vec![7, 2]);
        assert_eq!(parse_in_order("1-3,0").unwrap(), vec![1, 2, 3, 0]);
        let e = parse_in_order("2,0-3").unwrap_err().to_string();
        assert!(e.contains("names CPU 2 twice"), "{e}");
        let huge = vec!["0-4096"; 20].join(",");
        let e = parse(&huge).unwrap_err().to_string();
        assert!(e.contains("more than 65536 CPUs"), "{e}");
    }

    #[test]
    fn formats_compactly() {
        assert_eq!(format_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(format_list(&[3]), "3");
    }
}
