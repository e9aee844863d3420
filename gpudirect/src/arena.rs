//! An allocator over one HugeMem: aligned regions handed out as owned
//! handles, returned (and merged with free neighbours) when dropped.
//!
//! Allocation is first-fit over a free list kept outside the memory: the
//! memory itself is a DMA target of the NIC and the GPU, so no allocator
//! metadata may live in it. Allocations happen when buckets and pools are
//! set up, not per packet, so a mutex is cheap enough.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::hugemem::{HugeMem, MemOptions, PageSize};

/// How to align a region's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// 64 bytes: no false sharing, full-width SIMD loads.
    CacheLine,
    /// 4 KiB: what DMA engines and cuMemHostRegister sub-ranges like.
    Page4K,
    /// The arena's page size (a whole hugepage).
    Page,
    /// Any power of two.
    Bytes(usize),
}

pub const CACHE_LINE: usize = 64;

#[derive(Clone)]
pub struct Arena {
    inner: Arc<ArenaInner>,
}

struct ArenaInner {
    mem: Arc<HugeMem>,
    /// Free blocks: offset -> length, never adjacent (merged on free).
    free: Mutex<BTreeMap<usize, usize>>,
}

impl Arena {
    /// Map `len` bytes (see HugeMem::new) and manage them.
    pub fn new(len: usize, opts: &MemOptions) -> Result<Arena> {
        Ok(Arena::over(HugeMem::new(len, opts)?))
    }

    pub fn over(mem: HugeMem) -> Arena {
        let mut free = BTreeMap::new();
        free.insert(0, mem.len());
        Arena {
            inner: Arc::new(ArenaInner {
                mem: Arc::new(mem),
                free: Mutex::new(free),
            }),
        }
    }

    /// The whole mapping (to register with DPDK or CUDA).
    pub fn memory(&self) -> &Arc<HugeMem> {
        &self.inner.mem
    }

    pub fn capacity(&self) -> usize {
        self.inner.mem.len()
    }

    pub fn page_size(&self) -> PageSize {
        self.inner.mem.page_size()
    }

    pub fn is_huge(&self) -> bool {
        self.inner.mem.is_huge()
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.mem.as_ptr()
    }

    pub fn contains(&self, ptr: *const u8) -> bool {
        self.inner.mem.contains(ptr)
    }

    pub fn free_bytes(&self) -> usize {
        self.inner.free.lock().unwrap().values().sum()
    }

    pub fn largest_free(&self) -> usize {
        self.inner
            .free
            .lock()
            .unwrap()
            .values()
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// `len` bytes starting at a multiple of `align`. The contents are
    /// whatever the last user left (zero on a fresh arena).
    pub fn alloc(&self, len: usize, align: Align) -> Result<Region> {
        let align = match align {
            Align::CacheLine => CACHE_LINE,
            Align::Page4K => 4096,
            Align::Page => self.page_size().bytes(),
            Align::Bytes(a) if a.is_power_of_two() => a,
            Align::Bytes(a) => {
                return Err(Error::InvalidArgument(format!(
                    "alignment {a} is not a power of two"
                )))
            }
        };
        if len == 0 {
            return Err(Error::InvalidArgument("a zero-length region".into()));
        }
        let base = self.as_ptr() as usize;
        let mut free = self.inner.free.lock().unwrap();
        let found = free.iter().find_map(|(&off, &flen)| {
            let start = (base + off).checked_next_multiple_of(align)? - base;
            let end = start.checked_add(len)?;
            (end <= off + flen).then_some((off, flen, start, end))
        });
        let Some((off, flen, start, end)) = found else {
            return Err(Error::Exhausted {
                requested: len,
                align,
                free: free.values().sum(),
                capacity: self.capacity(),
                largest: free.values().copied().max().unwrap_or(0),
            });
        };
        free.remove(&off);
        if start > off {
            free.insert(off, start - off);
        }
        if off + flen > end {
            free.insert(end, off + flen - end);
        }
        Ok(Region {
            arena: self.inner.clone(),
            offset: start,
            len,
        })
    }
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("mem", &self.inner.mem)
            .field("free", &self.free_bytes())
            .finish()
    }
}

/// An allocation in an arena, exclusively owned; returned on drop. Keeps the
/// arena's memory mapped while it lives.
pub struct Region {
    arena: Arc<ArenaInner>,
    offset: usize,
    len: usize,
}

impl Region {
    /// Offset from the arena's start.
    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        // SAFETY: offset + len lies inside the mapping (checked in alloc).
        unsafe { self.arena.mem.as_ptr().add(self.offset) }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the bytes are mapped while self holds the arena, always
        // initialised (zeroed by mmap, then written as bytes), and no other
        // Region overlaps them.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; &mut self makes this view exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len) }
    }

    /// The mapping this region lies in.
    pub fn memory(&self) -> &Arc<HugeMem> {
        &self.arena.mem
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let mut free = self.arena.free.lock().unwrap();
        let (mut off, mut len) = (self.offset, self.len);
        // Merge with the free block before and the one after, if adjacent.
        if let Some((&poff, &plen)) = free.range(..off).next_back() {
            if poff + plen == off {
                free.remove(&poff);
                off = poff;
                len += plen;
            }
        }
        if let Some(&nlen) = free.get(&(off + len)) {
            free.remove(&(off + len));
            len += nlen;
        }
        free.insert(off, len);
    }
}
