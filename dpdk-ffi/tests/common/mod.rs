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
    let mut f: Vec<u8> = (0..len)
        .map(|i| (i as u32 ^ seq.wrapping_mul(31)) as u8)
        .collect();
    if len >= 16 {
        f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
        f[12..14].copy_from_slice(&[0x88, 0xb5]); // local experimental ethertype
        f[14..18.min(len)].copy_from_slice(&seq.to_be_bytes()[..(18.min(len) - 14)]);
    }
    f
}

/// A veth pair that exists for the life of the value (needs root).
pub struct Veth {
    pub a: String,
    pub b: String,
}

impl Veth {
    pub fn new(a: &str, b: &str) -> Veth {
        let _ = ip(&["link", "del", a]);
        ip(&["link", "add", a, "type", "veth", "peer", "name", b])
            .expect("ip link add veth (root?)");
        for dev in [a, b] {
            // No IPv6 so the kernel sends no router/neighbour solicitations.
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"), "1");
            ip(&["link", "set", dev, "up"]).unwrap();
        }
        Veth {
            a: a.into(),
            b: b.into(),
        }
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.a]);
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}
