//! EAL in IOVA-as-PA mode: only memory whose pages cannot move may take
//! DMA. (One EAL per process: this file has its own.)

mod common;

use dpdk_ffi::IovaMode;
use gpudirect::{Arena, DpdkArena, MemOptions, PageSize};

#[test]
fn in_pa_mode_an_arena_of_normal_pages_is_refused_and_hugepages_are_taken() {
    let eal = common::eal(&["--iova-mode=pa"]);
    assert_eq!(IovaMode::current(&eal), IovaMode::Pa);
    let normal = Arena::new(
        4 << 20,
        &MemOptions {
            page_size: Some(PageSize::Normal),
            ..MemOptions::default()
        },
    )
    .unwrap();
    let err = DpdkArena::register(&eal, &normal).err().expect("refused");
    assert!(
        err.to_string().contains("--iova-mode=va"),
        "names the way out: {err}"
    );
    let huge = Arena::new(
        4 << 20,
        &MemOptions {
            page_size: Some(PageSize::Huge2M),
            fallback: false,
            ..MemOptions::default()
        },
    )
    .unwrap();
    let dpdk = DpdkArena::register(&eal, &huge).expect("hugepages are fine");
    assert_eq!(dpdk.iova_mode(), IovaMode::Pa);
}
