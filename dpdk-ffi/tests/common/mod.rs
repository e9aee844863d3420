//! One EAL per test process (nextest runs each test in its own process;
//! plain `cargo test` shares one process, so tests share this EAL and use
//! device names of their own).
#![allow(dead_code)]

use std::sync::OnceLock;

use dpdk_ffi::{Eal, Mempool, DEFAULT_DATA_ROOM};

pub fn eal() -> Eal {
    static EAL: OnceLock<Eal> = OnceLock::new();
    EAL.get_or_init(|| {
        Eal::init([
            "-l",
            "0-1",
            "--no-pci",
            "--in-memory",
            "--log-level=*:warning",
        ])
        .expect("EAL init (run scripts/setup-host.sh for hugepages)")
    })
    .clone()
}

pub fn pool(name: &str, size: u32) -> Mempool {
    // No per-lcore cache, so counts are exact at every moment.
    Mempool::new(&eal(), name, size, 0, DEFAULT_DATA_ROOM, None).expect("mempool")
}

/// A frame whose bytes encode `seq` so that copies can be told apart.
pub fn frame(seq: u32, len: usize) -> Vec<u8> {
    let mut f: Vec<u8> = (0..len).map(|i| (i as u32 ^ seq.wrapping_mul(31)) as u8).collect();
    if len >= 16 {
        f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
        f[12..14].copy_from_slice(&[0x88, 0xb5]); // local experimental ethertype
        f[14..18.min(len)].copy_from_slice(&seq.to_be_bytes()[..(18.min(len) - 14)]);
    }
    f
}
