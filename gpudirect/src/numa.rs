//! NUMA placement of a mapping before its pages are touched.

use std::io;

/// The online NUMA nodes (`[0]` when sysfs does not say).
pub fn online_nodes() -> Vec<u32> {
    let text = std::fs::read_to_string("/sys/devices/system/node/online").unwrap_or_default();
    let mut nodes = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let mut ends = part.split('-').map(|n| n.parse::<u32>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), Some(Ok(b))) => nodes.extend(a..=b),
            (Some(Ok(a)), None) => nodes.push(a),
            _ => {}
        }
    }
    if nodes.is_empty() {
        nodes.push(0);
    }
    nodes
}

/// Bind `len` bytes at `addr` to `node` (MPOL_BIND). Must run before the
/// pages are first touched: placement happens at fault time.
pub(crate) fn bind(addr: *mut u8, len: usize, node: u32) -> io::Result<()> {
    const MPOL_BIND: libc::c_long = 2;
    if node >= 1024 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut mask = [0u64; 16]; // 1024 nodes
    mask[node as usize / 64] |= 1 << (node % 64);
    // SAFETY: mbind only changes the policy of our own mapping [addr, +len);
    // the mask buffer holds maxnode (1024) bits.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr as *mut libc::c_void,
            len,
            MPOL_BIND,
            mask.as_ptr(),
            (mask.len() * 64) as libc::c_ulong,
            0 as libc::c_uint,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
