//! What the host offers in hugepages, read from sysfs and /proc/mounts, so
//! that a failing EAL init can say which prerequisite is missing.

use std::fs;
use std::path::Path;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HugepageStatus {
    /// (page size in kB, pages reserved, pages free) for each size.
    pub sizes: Vec<(u64, u64, u64)>,
    /// Mount points of hugetlbfs.
    pub mounts: Vec<String>,
}

impl HugepageStatus {
    pub fn read() -> Self {
        let mut sizes = Vec::new();
        if let Ok(dir) = fs::read_dir("/sys/kernel/mm/hugepages") {
            for entry in dir.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(kb) = name
                    .strip_prefix("hugepages-")
                    .and_then(|s| s.strip_suffix("kB"))
                    .and_then(|s| s.parse().ok())
                else {
                    continue;
                };
                let read = |f: &str| read_u64(&entry.path().join(f));
                sizes.push((kb, read("nr_hugepages"), read("free_hugepages")));
            }
        }
        sizes.sort_unstable();
        let mounts = fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (_, point, fstype) = (f.next()?, f.next()?, f.next()?);
                (fstype == "hugetlbfs").then(|| point.to_owned())
            })
            .collect();
        Self { sizes, mounts }
    }

    pub fn free_bytes(&self) -> u64 {
        self.sizes
            .iter()
            .map(|(kb, _, free)| kb * 1024 * free)
            .sum()
    }

    /// Why DPDK cannot get hugepage memory here, or None if it can.
    pub fn problem(&self) -> Option<String> {
        if self.sizes.iter().all(|&(_, nr, _)| nr == 0) {
            return Some("no hugepages are reserved".into());
        }
        if self.free_bytes() == 0 {
            return Some("all reserved hugepages are in use".into());
        }
        if self.mounts.is_empty() {
            return Some("hugetlbfs is not mounted".into());
        }
        None
    }
}

fn read_u64(p: &Path) -> u64 {
    fs::read_to_string(p)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}
