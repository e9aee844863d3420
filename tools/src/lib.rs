//! The ainftp binaries: `ainftp-perf` (testpmd / nccl-tests style perf tool)
//! and their shared command-line plumbing.

pub mod arena_pool;
pub mod cpulist;
pub mod dp;
pub mod eal_setup;
pub mod error;
pub mod perf;
pub mod seconds;

pub use error::{Error, Result};

/// Writes `line` and a newline to stderr in one write. `eprintln!` writes
/// its pieces separately, so lines of ranks sharing one stderr interleave.
/// A failed write is ignored: `eprintln!` panics on a closed stderr
/// (`2>&1 | head`), and with panic=abort that would kill a run before it
/// drains and closes its ports.
pub fn eprint_line(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// `eprint_line` for stdout (reports, JSON summaries), for the same reason.
pub fn print_line(line: &str) {
    use std::io::Write;
    let _ = std::io::stdout()
        .lock()
        .write_all(format!("{line}\n").as_bytes());
}

/// `eprintln!` that cannot panic: see [`eprint_line`].
#[macro_export]
macro_rules! eline {
    ($($arg:tt)*) => {
        $crate::eprint_line(&format!($($arg)*))
    };
}

/// `println!` that cannot panic: see [`print_line`].
#[macro_export]
macro_rules! oline {
    ($($arg:tt)*) => {
        $crate::print_line(&format!($($arg)*))
    };
}

/// Log to stderr with `RUST_LOG`-style filtering (default: warnings).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only where a terminal shows them, not in log files.
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// `T`'s command with "-1" taken as a value by every flag that takes one.
/// By default clap reads it as an unknown flag, and its error names no
/// flag and suggests `-- -1`, which is wrong here: what follows `--` goes
/// to DPDK's EAL. Now the flag's own parser says what is wrong with it.
pub fn command_taking_negatives<T: clap::CommandFactory>() -> clap::Command {
    T::command().mut_args(|a| {
        if a.get_action().takes_values() && !a.is_last_set() {
            a.allow_negative_numbers(true)
        } else {
            a
        }
    })
}

/// Parses this process's arguments into `T` (see
/// [`command_taking_negatives`]); clap's own errors exit with its code 2.
/// The matches tell which flags the command line gave.
pub fn parse_args<T: clap::Parser>() -> (T, clap::ArgMatches) {
    parse_args_from(std::env::args_os())
}

/// [`parse_args`] over `args` (the program's name first), for a
/// subcommand that is its own command line (`ainftp-dp certs`).
pub fn parse_args_from<T: clap::Parser>(
    args: impl IntoIterator<Item = impl Into<std::ffi::OsString> + Clone>,
) -> (T, clap::ArgMatches) {
    let matches = command_taking_negatives::<T>().get_matches_from(args);
    match T::from_arg_matches(&matches) {
        Ok(args) => (args, matches),
        Err(e) => e.exit(),
    }
}
