//! The ainftp binaries: `ainftp-perf` (testpmd / nccl-tests style perf tool)
//! and their shared command-line plumbing.

pub mod arena_pool;
pub mod cpulist;
pub mod dp;
pub mod eal_setup;
pub mod error;
pub mod perf;

pub use error::{Error, Result};

/// Writes `line` and a newline to stderr in one write. `eprintln!` writes
/// its pieces separately, so lines of ranks sharing one stderr interleave.
pub fn eprint_line(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// Log to stderr with `RUST_LOG`-style filtering (default: warnings).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
