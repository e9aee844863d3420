//! Which flags each mode reads. `ainftp-perf` has one set of flags for all
//! its modes; a flag given to a mode that does not read it (`--vdev` on a
//! kernel-UDP run, `--op` on an all-gather) is refused with the reason
//! instead of being ignored, so a run never measures something other
//! than what its command line says.

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory};

use super::args::{Mode, PerfArgs, Transport};
use crate::error::{Error, Result};

/// Where a flag is read: which modes, and on which transport there.
struct Rule {
    modes: fn(Mode) -> bool,
    /// The transport the flag needs in a mode that has `--transport`.
    transport: Option<Transport>,
}

fn packet(m: Mode) -> bool {
    matches!(m, Mode::Io | Mode::Macswap | Mode::Rxonly | Mode::Txonly)
}

fn quic(m: Mode) -> bool {
    matches!(m, Mode::QuicServer | Mode::QuicClient)
}

/// The modes with `--transport`: QUIC's and the collectives.
fn stacked(m: Mode) -> bool {
    quic(m) || m.is_collective()
}

fn any(_: Mode) -> bool {
    true
}

/// The rule for the flag with clap id `id`; None for a flag not listed
/// (a test checks that every flag is).
fn rule(id: &str, mode: Mode) -> Option<Rule> {
    let anywhere = |modes: fn(Mode) -> bool| {
        Some(Rule {
            modes,
            transport: None,
        })
    };
    let on = |modes: fn(Mode) -> bool, t: Transport| {
        Some(Rule {
            modes,
            transport: Some(t),
        })
    };
    match id {
        "mode" | "json" => anywhere(any),
        // Packet modes always run on DPDK ports.
        "pci" | "vdev" | "eal_args" => on(|m| packet(m) || stacked(m), Transport::Dpdk),
        "ip" | "steering" | "mbuf_arena" | "mtu" => on(stacked, Transport::Dpdk),
        // Collectives pin their lanes with it on either transport.
        "lcores" if mode.is_collective() => anywhere(stacked),
        "lcores" => on(|m| packet(m) || quic(m), Transport::Dpdk),
        "queues" | "burst" | "pkt_size" | "stats_period" | "descriptors" | "eth_peer"
        | "tx_first" | "link_wait" => anywhere(packet),
        "duration" => anywhere(|m| {
            packet(m) || matches!(m, Mode::UdpEcho | Mode::QuicServer | Mode::TcpServer)
        }),
        // Collectives over kernel UDP spin for --spin-us instead.
        "idle" if mode.is_collective() => on(stacked, Transport::Dpdk),
        "idle" => anywhere(|m| packet(m) || quic(m) || m == Mode::UdpEcho),
        "bind" => anywhere(|m| matches!(m, Mode::UdpEcho | Mode::QuicServer | Mode::TcpServer)),
        "target" => {
            anywhere(|m| matches!(m, Mode::UdpPingpong | Mode::QuicClient | Mode::TcpClient))
        }
        "count" | "warmup" | "size" => {
            anywhere(|m| matches!(m, Mode::UdpPingpong | Mode::QuicClient))
        }
        "transport" | "certs" | "cc" | "pacing" => anywhere(stacked),
        "test" | "streams" => anywhere(|m| m == Mode::QuicClient),
        "conns" => anywhere(|m| matches!(m, Mode::QuicClient | Mode::TcpClient)),
        "connect_timeout" => anywhere(|m| m == Mode::QuicClient || m.is_collective()),
        "bytes" => anywhere(|m| matches!(m, Mode::QuicClient | Mode::TcpClient | Mode::Gpu)),
        "max_payload" => anywhere(quic),
        "iters" => anywhere(|m| m == Mode::Gpu || m.is_collective()),
        // On DPDK the port's MTU sets the datagram size.
        "udp_payload" => on(Mode::is_collective, Transport::Udp),
        // An all-gather or a broadcast reduces nothing.
        "op" => anywhere(|m| matches!(m, Mode::Allreduce | Mode::ReduceScatter)),
        "minbytes" | "maxbytes" | "stepfactor" | "warmup_iters" | "codec" | "clip" | "algo"
        | "dtype" | "progress" | "overlap_us" | "local_ranks" | "spin_us" | "conns_per_peer"
        | "lanes" | "lane_min_bytes" | "timeout" | "fault_exit_rank" | "fault_corrupt_rank" => {
            anywhere(Mode::is_collective)
        }
        _ => None,
    }
}

/// Refuses the first flag on the command line that `args.mode` does not
/// read (or reads only on the other transport).
pub fn check(matches: &ArgMatches, args: &PerfArgs) -> Result<()> {
    let cmd = PerfArgs::command();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if matches.value_source(id) != Some(ValueSource::CommandLine) {
            continue;
        }
        let Some(rule) = rule(id, args.mode) else {
            continue;
        };
        // As the user most likely typed it: -b, not --minbytes.
        let flag = match (arg.get_short(), arg.get_long()) {
            (Some(short), _) => format!("-{short}"),
            (None, Some(long)) => format!("--{long}"),
            // The EAL arguments after `--`.
            (None, None) => "EAL arguments (after --)".to_string(),
        };
        let mode = args.mode.name();
        if !(rule.modes)(args.mode) {
            return Err(Error::Usage(format!("{flag} does not apply to {mode}")));
        }
        let wanted = rule.transport.filter(|_| stacked(args.mode));
        if let Some(t) = wanted.filter(|&t| t != args.transport) {
            return Err(Error::Usage(format!(
                "{flag} applies to {mode} on --transport {} only (this run is on --transport {})",
                t.name(),
                args.transport.name()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{FromArgMatches, ValueEnum};

    fn checked(line: &[&str]) -> std::result::Result<(), String> {
        let argv = std::iter::once("ainftp-perf").chain(line.iter().copied());
        let matches = PerfArgs::command()
            .try_get_matches_from(argv)
            .map_err(|e| e.to_string())?;
        let args = PerfArgs::from_arg_matches(&matches).map_err(|e| e.to_string())?;
        check(&matches, &args).map_err(|e| e.to_string())
    }

    #[test]
    fn every_flag_has_a_rule_for_every_mode() {
        for arg in PerfArgs::command().get_arguments() {
            for mode in Mode::value_variants() {
                let id = arg.get_id().as_str();
                assert!(rule(id, *mode).is_some(), "no rule for {id} in {mode:?}");
            }
        }
    }

    #[test]
    fn flags_a_mode_reads_are_taken() {
        for line in [
            &[
                "io",
                "--vdev",
                "net_null0",
                "--burst",
                "64",
                "--duration",
                "1",
            ][..],
            &[
                "quic-client",
                "--transport",
                "dpdk",
                "--vdev",
                "net_null0",
                "--ip",
                "10.0.0.2/24",
            ],
            &[
                "quic-client",
                "--target",
                "127.0.0.1:1",
                "--idle",
                "busy",
                "--max-payload",
                "1300",
            ],
            &[
                "allreduce",
                "--lcores",
                "0",
                "--udp-payload",
                "1472",
                "--op",
                "max",
            ],
            &[
                "allreduce",
                "--transport",
                "dpdk",
                "--idle",
                "busy",
                "--mtu",
                "1500",
            ],
            &["reduce-scatter", "--op", "min"],
            &["udp-echo", "--bind", "127.0.0.1:0", "--duration", "1"],
            &["gpu", "--bytes", "4096", "-n", "3", "--json"],
        ] {
            assert_eq!(checked(line), Ok(()), "{line:?}");
        }
    }

    #[test]
    fn flags_a_mode_ignores_are_refused_with_the_reason() {
        for (line, why) in [
            (
                &["quic-client", "--vdev", "net_null0"][..],
                "--vdev applies to quic-client on --transport dpdk only (this run is on --transport udp)",
            ),
            (
                &["allreduce", "--mbuf-arena"],
                "--mbuf-arena applies to allreduce on --transport dpdk only",
            ),
            (
                &["allreduce", "--transport", "dpdk", "--udp-payload", "1472"],
                "--udp-payload applies to allreduce on --transport udp only",
            ),
            (&["allreduce", "--idle", "busy"], "--idle applies to allreduce on --transport dpdk only"),
            (&["quic-server", "--lcores", "0"], "--lcores applies to quic-server on --transport dpdk only"),
            (&["udp-echo", "--transport", "dpdk"], "--transport does not apply to udp-echo"),
            (&["allgather", "--op", "max"], "--op does not apply to allgather"),
            (&["broadcast", "--op", "sum"], "--op does not apply to broadcast"),
            (&["udp-pingpong", "--duration", "5"], "--duration does not apply to udp-pingpong"),
            (&["tcp-client", "--streams", "2"], "--streams does not apply to tcp-client"),
            (&["io", "-b", "8"], "-b does not apply to io"),
            (&["gpu", "--", "--no-huge"], "EAL arguments (after --) does not apply to gpu"),
        ] {
            let got = checked(line).unwrap_err();
            assert!(got.contains(why), "{line:?}: {got}");
        }
    }
}
