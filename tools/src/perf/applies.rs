//! Which flags each mode reads. `ainftp-perf` has one set of flags for all
//! its modes; a flag given to a mode that does not read it (`--vdev` on a
//! kernel-UDP run, `--op` on an all-gather) is refused with the reason
//! instead of being ignored, so a run never measures something other
//! than what its command line says.

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory};

use super::args::{Mode, PerfArgs, QuicTest, Transport};
use crate::error::{Error, Result};

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

/// Whether the flag with clap id `id` is read by the run `a` describes:
/// Ok, or Err with why not (the message after the flag's name). None for
/// a flag not listed (a test checks that every flag is).
fn verdict(id: &str, a: &PerfArgs) -> Option<std::result::Result<(), String>> {
    let m = a.mode;
    let name = m.name();
    let in_modes = |ok: bool| match ok {
        true => Ok(()),
        false => Err(format!("does not apply to {name}")),
    };
    // Read by the mode, on `want` where the mode has --transport.
    let on = |ok: bool, want: Transport| {
        in_modes(ok)?;
        match stacked(m) && a.transport != want {
            true => Err(format!(
                "applies to {name} on --transport {} only (this run is on --transport {})",
                want.name(),
                a.transport.name()
            )),
            false => Ok(()),
        }
    };
    // Read by the mode only `when`, which `otherwise` names.
    let when = |ok: bool, when: bool, otherwise: &str| {
        in_modes(ok)?;
        match when {
            true => Ok(()),
            false => Err(format!("does not apply to {name} {otherwise}")),
        }
    };
    let rr = a.test == QuicTest::Rr;
    let sends_frames = m == Mode::Txonly || (a.tx_first && matches!(m, Mode::Io | Mode::Macswap));
    Some(match id {
        "mode" | "json" => Ok(()),
        // Packet modes always run on DPDK ports.
        "pci" | "vdev" | "eal_args" => on(packet(m) || stacked(m), Transport::Dpdk),
        "ip" | "gateway" | "mbuf_arena" | "mtu" => on(stacked(m), Transport::Dpdk),
        // A collective's stack runs on one lcore per lane, inline.
        "steering" => on(quic(m), Transport::Dpdk),
        // Collectives pin their lanes with it on either transport.
        "lcores" if m.is_collective() => Ok(()),
        "lcores" => on(packet(m) || quic(m), Transport::Dpdk),
        "queues" | "burst" | "stats_period" | "descriptors" | "link_wait" => in_modes(packet(m)),
        "tx_first" => in_modes(matches!(m, Mode::Io | Mode::Macswap)),
        // The frame txonly and --tx-first send.
        "pkt_size" | "eth_peer" => when(
            matches!(m, Mode::Io | Mode::Macswap | Mode::Txonly),
            sends_frames,
            "without --tx-first",
        ),
        "duration" => {
            in_modes(packet(m) || matches!(m, Mode::UdpEcho | Mode::QuicServer | Mode::TcpServer))
        }
        // Collectives poll their sockets with --spin-us instead.
        "idle" => in_modes(packet(m) || quic(m) || m == Mode::UdpEcho),
        "bind" => in_modes(matches!(
            m,
            Mode::UdpEcho | Mode::QuicServer | Mode::TcpServer
        )),
        "target" => in_modes(matches!(
            m,
            Mode::UdpPingpong | Mode::QuicClient | Mode::TcpClient
        )),
        "count" | "warmup" | "size" if m == Mode::QuicClient => when(true, rr, "--test bulk"),
        "count" | "warmup" | "size" => in_modes(m == Mode::UdpPingpong),
        "test" | "conns" if m == Mode::QuicClient => Ok(()),
        "test" => in_modes(false),
        "conns" => in_modes(m == Mode::TcpClient),
        "streams" => when(m == Mode::QuicClient, !rr, "--test rr"),
        "bytes" if m == Mode::QuicClient => when(true, !rr, "--test rr"),
        "bytes" => in_modes(matches!(m, Mode::TcpClient | Mode::Gpu)),
        "transport" | "certs" | "cc" | "pacing" => in_modes(stacked(m)),
        "connect_timeout" => {
            in_modes(matches!(m, Mode::QuicClient | Mode::TcpClient) || m.is_collective())
        }
        "max_payload" => in_modes(quic(m)),
        "iters" => in_modes(m == Mode::Gpu || m.is_collective()),
        // On DPDK the port's MTU sets the datagram size.
        "udp_payload" => on(m.is_collective(), Transport::Udp),
        // An all-gather or a broadcast reduces nothing.
        "op" => in_modes(matches!(m, Mode::Allreduce | Mode::ReduceScatter)),
        "minbytes" | "maxbytes" | "stepfactor" | "warmup_iters" | "codec" | "clip" | "algo"
        | "dtype" | "progress" | "overlap_us" | "local_ranks" | "spin_us" | "conns_per_peer"
        | "lanes" | "lane_min_bytes" | "timeout" | "fault_exit_rank" | "fault_corrupt_rank" => {
            in_modes(m.is_collective())
        }
        _ => return None,
    })
}

/// Refuses the first flag on the command line that the run does not read
/// (another mode's, or its mode's on the other transport or test).
pub fn check(matches: &ArgMatches, args: &PerfArgs) -> Result<()> {
    let cmd = PerfArgs::command();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if matches.value_source(id) != Some(ValueSource::CommandLine) {
            continue;
        }
        let Some(Err(why)) = verdict(id, args) else {
            continue;
        };
        // As the user most likely typed it: -b, not --minbytes.
        let flag = match (arg.get_short(), arg.get_long()) {
            (Some(short), _) => format!("-{short}"),
            (None, Some(long)) => format!("--{long}"),
            // The EAL arguments after `--`.
            (None, None) => "EAL arguments (after --)".to_string(),
        };
        return Err(Error::Usage(format!("{flag} {why}")));
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
        for mode in Mode::value_variants() {
            let args = PerfArgs::from_arg_matches(
                &PerfArgs::command().get_matches_from(["ainftp-perf", mode.name()]),
            )
            .unwrap();
            for arg in PerfArgs::command().get_arguments() {
                let id = arg.get_id().as_str();
                assert!(verdict(id, &args).is_some(), "no rule for {id} in {mode:?}");
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
            &["allreduce", "--transport", "dpdk", "--mtu", "1500"],
            &[
                "io",
                "--vdev",
                "net_null0",
                "--tx-first",
                "--pkt-size",
                "128",
            ],
            &[
                "txonly",
                "--vdev",
                "net_null0",
                "--eth-peer",
                "02:00:00:00:00:09",
            ],
            &[
                "quic-client",
                "--test",
                "rr",
                "--size",
                "64",
                "--count",
                "10",
            ],
            &[
                "quic-client",
                "--streams",
                "4",
                "--bytes",
                "1000",
                "--conns",
                "2",
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
            (&["allreduce", "--idle", "busy"], "--idle does not apply to allreduce"),
            (
                &["allreduce", "--transport", "dpdk", "--steering", "rss"],
                "--steering does not apply to allreduce",
            ),
            (&["io", "--vdev", "net_null0", "--pkt-size", "128"], "--pkt-size does not apply to io without --tx-first"),
            (&["rxonly", "--vdev", "net_null0", "--tx-first"], "--tx-first does not apply to rxonly"),
            (&["quic-client", "--size", "100"], "--size does not apply to quic-client --test bulk"),
            (&["quic-client", "--test", "rr", "--streams", "2"], "--streams does not apply to quic-client --test rr"),
            (&["quic-client", "--test", "rr", "--bytes", "9"], "--bytes does not apply to quic-client --test rr"),
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
