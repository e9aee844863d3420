//! ainftp-dp: the per-node data-plane appliance.

use std::process::ExitCode;

use tools::dp::{self, args::DpArgs};

fn main() -> ExitCode {
    tools::init_logging();
    // args_os: an argument that is not UTF-8 is clap's to refuse, in one
    // line (args() panics on it).
    if std::env::args_os().nth(1).is_some_and(|a| a == "certs") {
        return certs();
    }
    let (args, _) = tools::parse_args::<DpArgs>();
    match dp::run(&args) {
        Ok(summary) => {
            if args.json {
                tools::oline!(
                    "{}",
                    serde_json::to_string(&summary).expect("summary serialises")
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            tools::eline!("ainftp-dp: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `ainftp-dp certs ...`: the cluster's CA and node certificates.
fn certs() -> ExitCode {
    let (args, _) = tools::parse_args_from::<dp::certs::CertsArgs>(std::env::args_os().skip(1));
    match dp::certs::run(&args) {
        Ok(lines) => {
            for l in lines {
                tools::oline!("{l}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            tools::eline!("ainftp-dp certs: {e}");
            ExitCode::FAILURE
        }
    }
}
