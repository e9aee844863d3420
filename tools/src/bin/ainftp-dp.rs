//! ainftp-dp: the per-node data-plane appliance.

use std::process::ExitCode;

use clap::Parser;
use tools::dp::{self, args::DpArgs};

fn main() -> ExitCode {
    tools::init_logging();
    let args = DpArgs::parse();
    match dp::run(&args) {
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
            eprintln!("ainftp-dp: {e}");
            ExitCode::FAILURE
        }
    }
}
