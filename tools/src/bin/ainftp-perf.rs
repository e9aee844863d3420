//! ainftp-perf: testpmd-style packet forwarding on DPDK ports.

use std::process::ExitCode;

use clap::Parser;
use tools::perf::{self, args::PerfArgs};

fn main() -> ExitCode {
    tools::init_logging();
    let args = PerfArgs::parse();
    match perf::run(&args) {
        Ok(summary) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string(&summary).expect("summary serialises")
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ainftp-perf: {e}");
            ExitCode::FAILURE
        }
    }
}
