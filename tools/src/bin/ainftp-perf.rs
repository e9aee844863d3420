//! ainftp-perf: testpmd-style packet forwarding on DPDK ports, UDP
//! echo / ping-pong on kernel sockets for latency baselines, QUIC bulk and
//! request/response over kernel UDP or our DPDK stack, kernel TCP bulk,
//! nccl-tests style collectives over QUIC, and GPU copy / codec rates.

use std::process::ExitCode;

use tools::perf::{self, args::Mode, args::PerfArgs};

fn main() -> ExitCode {
    tools::init_logging();
    let (args, given) = tools::parse_args::<PerfArgs>();
    if let Err(e) = perf::applies::check(&given, &args) {
        tools::eline!("ainftp-perf: {e}");
        return ExitCode::FAILURE;
    }
    if args.mode.is_collective() {
        // Rows are printed as they are measured.
        return match perf::coll::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tools::eline!("ainftp-perf: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let result = match args.mode {
        Mode::UdpEcho => perf::udp::echo(&args),
        Mode::UdpPingpong => perf::udp::pingpong(&args),
        Mode::QuicServer => {
            perf::quic::check_certs(&args.certs).and_then(|_| perf::quic::server(&args))
        }
        Mode::QuicClient => {
            perf::quic::check_certs(&args.certs).and_then(|_| perf::quic::client(&args))
        }
        Mode::TcpServer => perf::tcp::server(&args),
        Mode::TcpClient => perf::tcp::client(&args),
        Mode::Gpu => perf::gpu::run(&args),
        _ => perf::run(&args).map(|s| serde_json::to_value(&s).expect("summary serialises")),
    };
    match result {
        Ok(summary) => {
            if args.json {
                tools::oline!("{summary}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            if let (tools::error::Error::EndedEarly { summary, .. }, true) = (&e, args.json) {
                tools::oline!("{summary}");
            }
            tools::eline!("ainftp-perf: {e}");
            ExitCode::FAILURE
        }
    }
}
