//! The hugepage arena: real 2 MB pages (as the kernel reports them), locked;
//! aligned, disjoint, reusable regions; clear errors; the fallback to
//! normal pages with a single warning.

mod common;

use gpudirect::{Align, Arena, Error, MemOptions, PageSize};

/// What /proc/self/smaps says about the mapping that holds `base`.
struct Smaps {
    page_kb: u64,
    /// VM_LOCKED ("lo" in VmFlags): mlock'd.
    locked: bool,
    /// Resident kB: Rss for normal pages, Private_Hugetlb for hugepages.
    resident_kb: u64,
    /// The mapping's whole size. The kernel merges adjacent anonymous
    /// mappings with the same flags, so two arenas can share one.
    size_kb: u64,
}

/// A mapping's first line: `start-end perms offset dev inode [path]`.
fn mapping_range(line: &str) -> Option<(usize, usize)> {
    let range = line.split_whitespace().next()?;
    let (start, end) = range.split_once('-')?;
    Some((
        usize::from_str_radix(start, 16).ok()?,
        usize::from_str_radix(end, 16).ok()?,
    ))
}

fn smaps(base: *const u8) -> Smaps {
    smaps_in(&std::fs::read_to_string("/proc/self/smaps").unwrap(), base)
}

fn smaps_in(text: &str, base: *const u8) -> Smaps {
    let at = base as usize;
    let mut lines = text.lines();
    let (start, end) = lines
        .by_ref()
        .filter_map(mapping_range)
        .find(|&(start, end)| start <= at && at < end)
        .unwrap_or_else(|| panic!("no mapping holds {base:?}"));
    let block: Vec<&str> = lines.take_while(|l| mapping_range(l).is_none()).collect();
    let kb = |name: &str| -> u64 {
        block
            .iter()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or_else(|| panic!("{name} missing"))
            .parse()
            .unwrap()
    };
    let flags = block.iter().find(|l| l.starts_with("VmFlags:")).unwrap();
    Smaps {
        page_kb: kb("KernelPageSize:"),
        locked: flags.split_whitespace().any(|f| f == "lo"),
        resident_kb: kb("Rss:") + kb("Private_Hugetlb:"),
        size_kb: ((end - start) / 1024) as u64,
    }
}

/// The lookup finds an arena inside a mapping that starts below it (the
/// kernel merged it with its neighbour), not only at a mapping's start.
#[test]
fn smaps_lookup_finds_an_arena_inside_a_merged_mapping() {
    let text = "\
7f0000000000-7f0000300000 rw-p 00000000 00:00 0
Size:               3072 kB
KernelPageSize:        4 kB
Rss:                3072 kB
Private_Hugetlb:       0 kB
VmFlags: rd wr mr mw me lo ac
7f0000300000-7f0004300000 rw-p 00000000 00:00 0
Size:              65536 kB
KernelPageSize:        4 kB
Rss:               65536 kB
Private_Hugetlb:       0 kB
VmFlags: rd wr mr mw me ac
";
    let inside = smaps_in(text, 0x7f00_0010_0000 as *const u8);
    assert_eq!((inside.size_kb, inside.resident_kb), (3072, 3072));
    assert!(inside.locked);
    let second = smaps_in(text, 0x7f00_0030_0000 as *const u8);
    assert_eq!((second.size_kb, second.locked), (65536, false));
}

fn huge2m(fallback: bool) -> MemOptions {
    MemOptions {
        page_size: Some(PageSize::Huge2M),
        fallback,
        ..MemOptions::default()
    }
}

#[test]
fn arena_is_resident_2mb_pages_and_regions_are_aligned_and_disjoint() {
    common::ensure_hugepages(8);
    let arena = Arena::new(5 << 20, &huge2m(false)).unwrap();
    assert!(arena.is_huge());
    assert_eq!(arena.page_size(), PageSize::Huge2M);
    assert_eq!(arena.capacity(), 6 << 20, "rounded up to whole 2 MB pages");
    assert_eq!(arena.as_ptr() as usize % (2 << 20), 0);
    let m = smaps(arena.as_ptr());
    assert_eq!(m.page_kb, 2048, "the kernel maps it with 2 MB pages");
    // hugetlb pages are never swapped; the kernel does not flag them
    // VM_LOCKED, but mlock must have faulted every one in.
    assert_eq!(m.resident_kb, 6 * 1024, "every page faulted in");

    let mut regions = Vec::new();
    for (len, align, want) in [
        (1usize, Align::CacheLine, 64usize),
        (100, Align::Page4K, 4096),
        (3, Align::Bytes(1 << 16), 1 << 16),
        (10, Align::CacheLine, 64),
        (4096, Align::Page, 2 << 20),
    ] {
        let mut r = arena.alloc(len, align).unwrap();
        assert_eq!(
            r.as_ptr() as usize % want,
            0,
            "{len} bytes aligned to {want}"
        );
        assert_eq!(r.len(), len);
        assert!(arena.contains(r.as_ptr()));
        assert!(arena.contains(last_byte(&r)));
        let fill = regions.len() as u8 + 1;
        r.as_mut_slice().fill(fill);
        regions.push((r, fill));
    }
    // Disjoint: every region still holds what it was filled with.
    for (r, fill) in &regions {
        assert!(
            r.as_slice().iter().all(|b| b == fill),
            "{r:?} was overwritten"
        );
    }
    let mut spans: Vec<_> = regions
        .iter()
        .map(|(r, _)| (r.offset(), r.offset() + r.len()))
        .collect();
    spans.sort();
    assert!(
        spans.windows(2).all(|w| w[0].1 <= w[1].0),
        "{spans:?} overlap"
    );
}

/// The address of a region's last byte.
fn last_byte(r: &gpudirect::Region) -> *const u8 {
    r.as_slice().last().unwrap() as *const u8
}

#[test]
fn freed_regions_merge_and_are_reused_and_exhaustion_says_what_to_do() {
    common::ensure_hugepages(4);
    let arena = Arena::new(2 << 20, &huge2m(false)).unwrap();
    let quarter = (2 << 20) / 4;
    let a = arena.alloc(quarter, Align::Page4K).unwrap();
    let b = arena.alloc(quarter, Align::Page4K).unwrap();
    let c = arena.alloc(quarter, Align::Page4K).unwrap();
    let d = arena.alloc(quarter, Align::Page4K).unwrap();
    assert_eq!(arena.free_bytes(), 0);

    let err = arena.alloc(1, Align::CacheLine).unwrap_err();
    assert!(
        matches!(err, Error::Exhausted { requested: 1, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("arena exhausted") && msg.contains("larger arena"),
        "{msg}"
    );

    // b and c freed: one merged block of half the arena, reused in place.
    let (b_off, c_end) = (b.offset(), c.offset() + c.len());
    drop(c);
    drop(b);
    assert_eq!(arena.largest_free(), 2 * quarter, "neighbours merged");
    let bc = arena.alloc(2 * quarter, Align::Page4K).unwrap();
    assert_eq!((bc.offset(), bc.offset() + bc.len()), (b_off, c_end));
    drop((a, bc, d));
    assert_eq!(arena.free_bytes(), arena.capacity());
    assert_eq!(arena.largest_free(), arena.capacity(), "all merged back");

    assert!(matches!(
        arena.alloc(0, Align::CacheLine),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        arena.alloc(8, Align::Bytes(48)),
        Err(Error::InvalidArgument(_))
    ));
    // Alignment padding counts: a page-aligned 2 MB block no longer fits
    // once a byte at the start is taken.
    let _first = arena.alloc(1, Align::CacheLine).unwrap();
    assert!(matches!(
        arena.alloc(2 << 20, Align::Page),
        Err(Error::Exhausted { .. })
    ));
}

#[test]
fn without_1g_hugepages_it_falls_back_to_normal_pages_and_warns_once() {
    let warnings = common::Counter::install(tracing::Level::WARN, "no hugepages");
    let opts = MemOptions {
        page_size: Some(PageSize::Huge1G),
        ..MemOptions::default()
    };
    if PageSize::Huge1G.free_pages() > 0 {
        // This host has 1 GB pages: then it must use them.
        let arena = Arena::new(64 << 20, &opts).unwrap();
        assert_eq!(arena.page_size(), PageSize::Huge1G);
        assert_eq!(smaps(arena.as_ptr()).page_kb, 1 << 20);
        return;
    }
    let first = Arena::new(64 << 20, &opts).unwrap();
    let second = Arena::new(3 << 20, &opts).unwrap();
    for arena in [&first, &second] {
        assert!(!arena.is_huge());
        assert_eq!(arena.page_size(), PageSize::Normal);
        let m = smaps(arena.as_ptr());
        assert_eq!(m.page_kb, 4);
        assert!(m.locked, "mlock'd");
        // The arena lies in this mapping (alone, or merged with the other
        // arena), and every page of the mapping is resident.
        assert!(
            m.size_kb as usize * 1024 >= arena.capacity(),
            "{}",
            m.size_kb
        );
        assert_eq!(m.resident_kb, m.size_kb, "resident");
    }
    assert_eq!(
        first.capacity(),
        64 << 20,
        "normal pages: no rounding to 1 GB"
    );
    assert_eq!(warnings.count(), 1, "one warning per process");

    // Without the fallback the same request is an error that names the fix.
    let strict = MemOptions {
        fallback: false,
        ..opts
    };
    let err = Arena::new(64 << 20, &strict).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NoHugepages {
                page_kb: 1048576,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("hugepages-1048576kB/nr_hugepages"),
        "{err}"
    );
}

#[test]
fn numa_nodes_are_listed_and_binding_to_node_0_works() {
    let nodes = gpudirect::numa::online_nodes();
    assert!(nodes.contains(&0), "{nodes:?}");
    common::ensure_hugepages(2);
    let arena = Arena::new(
        2 << 20,
        &MemOptions {
            numa_node: Some(0),
            ..huge2m(false)
        },
    )
    .unwrap();
    // One node: placement is implicit and reported as unbound.
    let want = (nodes.len() > 1).then_some(0);
    assert_eq!(arena.memory().numa_node(), want);
}
