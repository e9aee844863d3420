//! One locked mapping in hugepages (2 MB or 1 GB), optionally bound to a
//! NUMA node, falling back to normal pages when none are reserved.

use std::sync::Once;

use memmap2::{MmapMut, MmapOptions};

use crate::error::{Error, Result};
use crate::numa;

/// The page size of a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageSize {
    /// The kernel's base page (4 KiB on x86-64).
    Normal,
    Huge2M,
    Huge1G,
}

impl PageSize {
    pub fn bytes(self) -> usize {
        match self {
            PageSize::Normal => base_page(),
            PageSize::Huge2M => 2 << 20,
            PageSize::Huge1G => 1 << 30,
        }
    }

    pub fn is_huge(self) -> bool {
        self != PageSize::Normal
    }

    /// Free pages of this size in the kernel's pool (0 for normal pages).
    pub fn free_pages(self) -> usize {
        if !self.is_huge() {
            return 0;
        }
        let path = format!(
            "/sys/kernel/mm/hugepages/hugepages-{}kB/free_hugepages",
            self.bytes() / 1024
        );
        std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

fn base_page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

/// How to map an arena.
#[derive(Debug, Clone)]
pub struct MemOptions {
    /// None: 1 GB pages when enough are free for the whole length, else 2 MB.
    pub page_size: Option<PageSize>,
    /// Bind the memory to this NUMA node (ignored, with a note, on a
    /// machine with a single node).
    pub numa_node: Option<u32>,
    /// When the hugepages cannot be had, use normal pages (warning once)
    /// instead of failing.
    pub fallback: bool,
}

impl Default for MemOptions {
    fn default() -> Self {
        MemOptions {
            page_size: None,
            numa_node: None,
            fallback: true,
        }
    }
}

/// A page-locked anonymous mapping; unmapped on drop.
pub struct HugeMem {
    map: MmapMut,
    base: *mut u8,
    page: PageSize,
    node: Option<u32>,
}

// SAFETY: HugeMem owns its mapping; `base` is just its address. Shared
// access hands out raw pointers only (Arena hands out disjoint regions).
unsafe impl Send for HugeMem {}
// SAFETY: as above; no interior state is mutated through &HugeMem.
unsafe impl Sync for HugeMem {}

static FALLBACK_WARNING: Once = Once::new();

impl HugeMem {
    /// Map at least `len` bytes (rounded up to whole pages), bind them to
    /// the NUMA node asked for, and lock them in RAM.
    pub fn new(len: usize, opts: &MemOptions) -> Result<HugeMem> {
        if len == 0 {
            return Err(Error::InvalidArgument("a zero-length arena".into()));
        }
        let candidates = match opts.page_size {
            Some(page) => vec![page],
            None => auto_page_sizes(
                len,
                PageSize::Huge1G.free_pages() * PageSize::Huge1G.bytes(),
            ),
        };
        // The last candidate's error decides below; the others only lead on.
        let mut mapped = Err(std::io::Error::other("no page size tried"));
        let mut want = candidates[0];
        for page in candidates {
            want = page;
            mapped = map_anon(len, page);
            if mapped.is_ok() {
                break;
            }
        }
        let (map, page) = match mapped {
            Ok(m) => (m, want),
            Err(source) if want.is_huge() && opts.fallback => {
                FALLBACK_WARNING.call_once(|| {
                    tracing::warn!(
                        wanted = want.bytes(),
                        len,
                        error = %source,
                        "no hugepages for the arena: using normal pages (slower DMA, more TLB misses); \
                         reserve them with scripts/setup-host.sh"
                    )
                });
                (
                    map_anon(len, PageSize::Normal).map_err(|source| Error::Map { len, source })?,
                    PageSize::Normal,
                )
            }
            Err(source) if want.is_huge() => {
                return Err(Error::NoHugepages {
                    page_kb: want.bytes() / 1024,
                    len,
                    source,
                })
            }
            Err(source) => return Err(Error::Map { len, source }),
        };
        let mut map = map;
        let base = map.as_mut_ptr();
        let node = match opts.numa_node {
            Some(node) if numa::online_nodes().len() > 1 => {
                numa::bind(base, map.len(), node).map_err(|source| Error::Numa { node, source })?;
                Some(node)
            }
            Some(node) => {
                tracing::debug!(
                    node,
                    "one NUMA node: the arena is local to every core already"
                );
                None
            }
            None => None,
        };
        // mlock faults every page in (on the bound node) and keeps it
        // resident, so DPDK's physical addresses and CUDA's registration
        // stay valid. (hugetlb pages cannot be swapped anyway; the kernel
        // only populates them and does not flag them locked.)
        map.lock().map_err(|source| Error::Lock {
            len: map.len(),
            source,
        })?;
        tracing::debug!(
            len = map.len(),
            page = page.bytes(),
            ?node,
            "arena memory mapped"
        );
        Ok(HugeMem {
            map,
            base,
            page,
            node,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.base
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn page_size(&self) -> PageSize {
        self.page
    }

    pub fn is_huge(&self) -> bool {
        self.page.is_huge()
    }

    /// The node the memory is bound to (None: not bound, or one node).
    pub fn numa_node(&self) -> Option<u32> {
        self.node
    }

    pub fn contains(&self, ptr: *const u8) -> bool {
        let b = self.base as usize;
        (b..b + self.len()).contains(&(ptr as usize))
    }
}

impl std::fmt::Debug for HugeMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HugeMem")
            .field("base", &self.base)
            .field("len", &self.len())
            .field("page_size", &self.page)
            .field("numa_node", &self.node)
            .finish()
    }
}

// SAFETY: the mapping is page-aligned, a whole number of pages, locked
// (mlock in new) and unmapped only when the HugeMem is dropped.
unsafe impl dpdk_ffi::PinnedMemory for HugeMem {
    fn as_ptr(&self) -> *mut u8 {
        self.base
    }
    fn len(&self) -> usize {
        self.map.len()
    }
    fn page_size(&self) -> usize {
        self.page.bytes()
    }
}

/// Page sizes to try, in order, for an arena of `len` bytes when none was
/// asked for: 1 GB pages when enough look free and they waste at most half
/// a page, then 2 MB pages (the free count includes pages other mappings
/// reserved, and a cgroup may allow 2 MB pages only); else 2 MB pages.
fn auto_page_sizes(len: usize, free_1g_bytes: usize) -> Vec<PageSize> {
    let gb = PageSize::Huge1G.bytes();
    let whole = len.next_multiple_of(gb);
    if free_1g_bytes >= whole && whole - len <= gb / 2 {
        vec![PageSize::Huge1G, PageSize::Huge2M]
    } else {
        vec![PageSize::Huge2M]
    }
}

fn map_anon(len: usize, page: PageSize) -> std::io::Result<MmapMut> {
    let len = len.next_multiple_of(page.bytes());
    let mut o = MmapOptions::new();
    o.len(len);
    match page {
        PageSize::Normal => {}
        PageSize::Huge2M => {
            o.huge(Some(21));
        }
        PageSize::Huge1G => {
            o.huge(Some(30));
        }
    }
    // MAP_HUGETLB reserves the pages at mmap time, so a shortage is an
    // error here rather than a SIGBUS on first touch.
    o.map_anon()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_pages_are_1g_only_when_free_and_mostly_used_and_fall_back_to_2m() {
        const MB: usize = 1 << 20;
        const GB: usize = 1 << 30;
        use PageSize::{Huge1G, Huge2M};
        // A 40 MB arena does not take a whole 1 GB page.
        assert_eq!(auto_page_sizes(40 * MB, 4 * GB), vec![Huge2M]);
        assert_eq!(auto_page_sizes(600 * MB, 4 * GB), vec![Huge1G, Huge2M]);
        assert_eq!(auto_page_sizes(2 * GB, 4 * GB), vec![Huge1G, Huge2M]);
        // 1 GB pages that do not cover it: 2 MB.
        assert_eq!(auto_page_sizes(2 * GB, GB), vec![Huge2M]);
        assert_eq!(auto_page_sizes(GB + 100 * MB, 4 * GB), vec![Huge2M]);
    }
}
