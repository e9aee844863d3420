//! ainftp-perf as a user runs it: bad input gets one clear line and a
//! non-zero exit; good input moves packets and ends with a JSON summary.

mod common;

use std::process::{Command, Output};

const PERF: &str = env!("CARGO_BIN_EXE_ainftp-perf");

fn perf(args: &[&str]) -> Output {
    Command::new(PERF)
        .args(args)
        .output()
        .expect("run ainftp-perf")
}

/// The run failed with exactly one line on stderr that contains `needle`.
fn assert_one_line_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail: {stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("ainftp-perf:"))
        .collect();
    assert_eq!(ours.len(), 1, "one error line expected: {stderr}");
    assert!(ours[0].contains(needle), "'{needle}' not in: {}", ours[0]);
}

fn last_json(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {stdout}"))
}

#[test]
fn unknown_mode_is_rejected_with_the_valid_modes() {
    let out = perf(&["fastest", "--vdev", "net_null0"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid value 'fastest'"), "{stderr}");
    assert!(stderr.contains("io, macswap, rxonly, txonly"), "{stderr}");
}

#[test]
fn malformed_lcore_list_names_the_syntax() {
    let out = perf(&["io", "--vdev", "net_null0", "--lcores", "2-a"]);
    assert_one_line_error(&out, "malformed lcore list '2-a'");
}

#[test]
fn an_lcore_that_is_not_online_is_named() {
    let out = perf(&["io", "--vdev", "net_null0", "--lcores", "0,1000"]);
    assert_one_line_error(&out, "lcore 1000 is not an online CPU");
}

#[test]
fn no_port_says_how_to_give_one() {
    let out = perf(&["io"]);
    assert_one_line_error(&out, "--vdev net_null0");
}

#[test]
fn a_bad_vdev_is_a_clear_error() {
    let out = perf(&["io", "--vdev", "net_bogus0", "--duration", "1"]);
    assert_one_line_error(&out, "cannot open device 'net_bogus0'");
}

#[test]
fn a_bad_pci_address_is_a_clear_error() {
    let out = perf(&["io", "--pci", "0000:ff:1f.7", "--duration", "1"]);
    assert_one_line_error(&out, "vfio-pci");
}

#[test]
fn missing_hugepages_point_to_the_setup_script() {
    // A private mount namespace without hugetlbfs: the host stays as it is.
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "umount -a -t hugetlbfs && exec {PERF} io --vdev net_null0 --duration 1"
        ))
        .output()
        .expect("unshare (util-linux, root)");
    assert_one_line_error(&out, "run scripts/setup-host.sh");
    assert!(String::from_utf8_lossy(&out.stderr).contains("hugetlbfs is not mounted"));
}

#[test]
fn io_on_net_null_forwards_and_ends_with_a_json_summary() {
    let out = perf(&[
        "io",
        "--vdev",
        "net_null0",
        "--vdev",
        "net_null1",
        "--lcores",
        "0-1",
        "--duration",
        "1",
        "--stats-period",
        "0.5",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("NIC statistics for port 0"),
        "periodic stats: {stdout}"
    );
    let j = last_json(&out);
    assert_eq!(j["mode"], "io");
    assert!(j["duration_s"].as_f64().unwrap() >= 0.9);
    let ports = j["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 2);
    for p in ports {
        for k in [
            "rx_pps",
            "tx_pps",
            "rx_bps",
            "tx_bps",
            "rx_missed",
            "tx_dropped",
        ] {
            assert!(p.get(k).is_some(), "missing {k}");
        }
        // Everything received was forwarded: io on net_null drops nothing.
        assert!(p["rx_pps"].as_f64().unwrap() > 100_000.0, "{p}");
    }
    let total = j["total_rx_pps"].as_f64().unwrap();
    assert!(
        (total - ports[0]["rx_pps"].as_f64().unwrap() - ports[1]["rx_pps"].as_f64().unwrap()).abs()
            < 1.0
    );
}

/// A macswap run that succeeded and moved packets.
fn assert_forwarded(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(last_json(out)["total_tx_pps"].as_f64().unwrap() > 100_000.0);
}

#[test]
fn single_lcore_forwards_and_reports() {
    let out = perf(&[
        "macswap",
        "--vdev",
        "net_null0",
        "--lcores",
        "0",
        "--duration",
        "0.5",
        "--json",
    ]);
    assert_forwarded(&out);
}

/// Under taskset (or in a container's cpuset) the process may run on
/// fewer CPUs than are online: the default lcores come from those, and an
/// lcore outside them is named with the ones allowed. Both used to end in
/// DPDK failing to pin the thread ("cannot set affinity").
#[test]
fn lcores_are_taken_from_the_cpus_this_process_may_run_on() {
    let on_cpu_1 = |args: &[&str]| {
        Command::new("taskset")
            .args(["-c", "1", PERF])
            .args(args)
            .output()
            .expect("run taskset")
    };
    let out = on_cpu_1(&[
        "macswap",
        "--vdev",
        "net_null0",
        "--duration",
        "0.5",
        "--json",
    ]);
    assert_forwarded(&out);
    let out = on_cpu_1(&["macswap", "--vdev", "net_null0", "--lcores", "0"]);
    assert_one_line_error(
        &out,
        "lcore 0 is online, but this process may not run on it (its CPU affinity allows 1",
    );
}

#[test]
fn gpu_mode_without_a_gpu_says_so_in_one_line() {
    // SAFETY: only tries to dlopen libcuda.
    let driver = unsafe { gpudirect::cudarc::driver::sys::is_culib_present() };
    let out = perf(&["gpu", "--bytes", "1048576", "-n", "3"]);
    if driver && gpudirect::Gpu::probe().context().is_some() {
        // A GPU host: the mode measures (the GPU tests check the numbers).
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    assert_one_line_error(&out, "no CUDA driver or GPU");
    let out = perf(&["gpu", "--bytes", "2"]);
    assert_one_line_error(&out, "--bytes 2");
}

#[test]
fn unknown_steering_names_the_choices() {
    let out = perf(&["quic-client", "--transport", "dpdk", "--steering", "fast"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown steering 'fast': use auto, rss or software"),
        "{stderr}"
    );
}

/// Failed as clap fails a bad value (exit 2), naming `flag`, no panic.
fn assert_bad_value(out: &Output, flag: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("invalid value") && stderr.contains(flag),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_flag_the_mode_does_not_read_is_refused_before_anything_runs() {
    // Each would have been ignored: the run measured kernel UDP, or a
    // reduction that is none.
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "quic-client",
                "--target",
                "127.0.0.1:9",
                "--vdev",
                "net_null0",
            ],
            "--vdev applies to quic-client on --transport dpdk only",
        ),
        (
            &["udp-echo", "--bind", "127.0.0.1:0", "--transport", "dpdk"],
            "--transport does not apply to udp-echo",
        ),
        (
            &["allgather", "--local-ranks", "2", "--op", "max"],
            "--op does not apply to allgather",
        ),
        (
            &["tcp-client", "--target", "127.0.0.1:9", "--streams", "4"],
            "--streams does not apply to tcp-client",
        ),
    ];
    for (args, needle) in cases {
        assert_one_line_error(&perf(args), needle);
    }
}

#[test]
fn a_negative_number_is_a_bad_value_of_its_flag() {
    for (args, flag) in [
        (&["allreduce", "-b", "-8"][..], "--minbytes"),
        (&["allreduce", "-w", "-1"], "--warmup-iters"),
        (&["allreduce", "--codec", "i16", "--clip", "-1"], "--clip"),
        (
            &["io", "--vdev", "net_null0", "--descriptors", "-1"],
            "--descriptors",
        ),
    ] {
        let out = perf(args);
        assert_bad_value(&out, flag);
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("to pass '-"),
            "{args:?}"
        );
    }
}

#[test]
fn packet_mode_errors_name_the_flag() {
    assert_one_line_error(
        &perf(&["io", "--vdev", "net_null0", "--lcores", "7-2"]),
        "--lcores \"7-2\"",
    );
    assert_one_line_error(
        &perf(&["txonly", "--vdev", "net_null0", "--eth-peer", "zz"]),
        "--eth-peer: malformed MAC address 'zz'",
    );
}

#[test]
fn seconds_flags_refuse_what_a_duration_cannot_hold() {
    for (flag, value) in [
        ("--duration", "1e30"),
        ("--duration", "-1"),
        ("--stats-period", "NaN"),
        ("--link-wait", "inf"),
    ] {
        let out = perf(&["macswap", "--vdev", "net_null0", flag, value]);
        assert_bad_value(&out, flag);
    }
    let out = perf(&["quic-server", "--bind", "127.0.0.1:0", "--duration", "1e30"]);
    assert_bad_value(&out, "--duration");
}

#[test]
fn out_of_range_counts_and_sizes_are_refused_before_anything_runs() {
    let too_small_payload = perf(&[
        "quic-client",
        "--target",
        "127.0.0.1:9",
        "--max-payload",
        "10",
    ]);
    assert_bad_value(&too_small_payload, "--max-payload");
    // A port whose frames cannot carry QUIC's 1200-byte datagrams: the run
    // never connected and ended in a timeout.
    let too_small_mtu = perf(&[
        "quic-server",
        "--transport",
        "dpdk",
        "--vdev",
        "net_null0",
        "--ip",
        "10.0.0.1/24",
        "--mtu",
        "1227",
    ]);
    assert_bad_value(&too_small_mtu, "--mtu");
    assert!(String::from_utf8_lossy(&too_small_mtu.stderr).contains("1228"));
    let too_many_conns = perf(&["tcp-client", "--target", "127.0.0.1:9", "--conns", "100000"]);
    assert_bad_value(&too_many_conns, "--conns");
    let no_rounds = perf(&["udp-pingpong", "--target", "127.0.0.1:9", "--count", "0"]);
    assert_bad_value(&no_rounds, "--count");
    let overflow = perf(&[
        "allreduce",
        "--local-ranks",
        "2",
        "-b",
        "8",
        "-e",
        "99999999999G",
    ]);
    assert_bad_value(&overflow, "--maxbytes");
    assert!(String::from_utf8_lossy(&overflow.stderr).contains("at most 1024G"));
    // Parsable, but more than this machine has: refused up front rather
    // than aborting a rank in the allocator.
    let huge = perf(&[
        "allreduce",
        "--local-ranks",
        "1",
        "-b",
        "1024G",
        "-e",
        "1024G",
        "-n",
        "1",
    ]);
    assert_one_line_error(&huge, "MiB are available");
}

#[test]
fn a_quic_client_with_nobody_listening_fails_within_its_connect_timeout() {
    // A socket that never answers: no ICMP either, so only the timeout
    // can end the handshake.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = silent.local_addr().unwrap().to_string();
    let started = std::time::Instant::now();
    let out = perf(&["quic-client", "--target", &target, "--connect-timeout", "1"]);
    // The last line is the error (a line on the datagram size comes first).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && !stderr.contains("panicked"),
        "{stderr}"
    );
    let expected =
        format!("ainftp-perf: quic client: no QUIC server answered at {target} within 1.0 s");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with(&expected), "{stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn udp_pingpong_against_a_silent_target_fails_instead_of_reporting_zero_latency() {
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = silent.local_addr().unwrap().to_string();
    let out = perf(&[
        "udp-pingpong",
        "--target",
        &target,
        "--count",
        "100",
        "--warmup",
        "0",
    ]);
    assert_one_line_error(&out, "no reply from");
    assert!(
        out.stdout.is_empty(),
        "no JSON summary for a run that measured nothing"
    );
}

#[test]
fn closed_output_pipes_do_not_abort_the_run() {
    // `| head`: the reader goes away while the run still prints (stats
    // and the summary on stdout, notes on stderr). A write to a closed
    // pipe used to panic, and panic=abort killed the run with SIGABRT.
    let mut cmd = Command::new(PERF);
    cmd.args([
        "macswap",
        "--vdev",
        "net_null0",
        "--lcores",
        "0",
        "--duration",
        "2",
        "--stats-period",
        "0.1",
    ]);
    let status = common::exit_with_closed_pipes(cmd);
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_file_prefix_run_leaves_no_hugepage_files_or_runtime_dir() {
    let prefix = format!("clitest{}", std::process::id());
    let out = perf(&[
        "macswap",
        "--vdev",
        "net_null0",
        "--lcores",
        "0",
        "--duration",
        "0.5",
        "--",
        "--file-prefix",
        &prefix,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left: Vec<String> = std::fs::read_dir("/dev/hugepages")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "hugepage files left: {left:?}");
    let runtime_dir = std::path::Path::new("/var/run/dpdk").join(&prefix);
    assert!(!runtime_dir.exists(), "{} left", runtime_dir.display());
}

#[test]
fn a_lone_torchrun_rank_gives_up_after_its_connect_timeout() {
    // Nobody at MASTER_ADDR:MASTER_PORT: the rank waits --connect-timeout,
    // not the 60 s default, and says what is missing.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let started = std::time::Instant::now();
    let out = Command::new(PERF)
        .args(["allreduce", "-e", "1M", "--connect-timeout", "2"])
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", &port)
        .output()
        .unwrap();
    assert_one_line_error(&out, "rank 0 is not listening");
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_secs(2) && waited < std::time::Duration::from_secs(20),
        "{waited:?}"
    );
}

#[test]
fn a_dpdk_target_beyond_the_subnet_needs_a_gateway() {
    // Without one, every packet was dropped as no_route and the run ended
    // 10 s later with "no QUIC server answered".
    let run = |extra: &[&str]| {
        let mut args = vec![
            "quic-client",
            "--transport",
            "dpdk",
            "--vdev",
            "net_null0",
            "--ip",
            "10.0.0.3/24",
            "--target",
            "192.168.1.5:4433",
            "--connect-timeout",
            "1",
        ];
        args.extend_from_slice(extra);
        perf(&args)
    };
    assert_ends_saying(
        &run(&[]),
        "outside 10.0.0.3/24 (--ip) and there is no --gateway",
    );
    assert_ends_saying(
        &run(&["--gateway", "10.1.0.1"]),
        "gateway 10.1.0.1 is outside",
    );
    assert_ends_saying(
        &run(&["--gateway", "router"]),
        "--gateway router is not an IPv4 address",
    );
    assert_ends_saying(
        &run(&["--gateway", "10.0.0.1", "--gateway", "10.0.0.2"]),
        "one for every port or one per --ip (1), not 2",
    );
    // Refused before DPDK starts: no EAL line, no port.
    let early = run(&[]);
    assert!(
        !String::from_utf8_lossy(&early.stderr).contains("port MTU"),
        "{early:?}"
    );
    // With one, the target is routed: the run gets as far as the handshake
    // (nobody answers on net_null).
    assert_ends_saying(&run(&["--gateway", "10.0.0.1"]), "no QUIC server answered");
}

/// The run failed, and its last line says `needle` (a QUIC run first
/// says which congestion control it runs).
fn assert_ends_saying(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains(needle),
        "'{needle}' not in the last line: {stderr}"
    );
}
