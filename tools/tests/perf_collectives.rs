//! ainftp-perf's collective modes with ranks as real processes over
//! kernel UDP on 127.0.0.1: reference results, bit-identical ranks, data
//! plane aggregation, a dead peer, and bad environments.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::{check_rows, PERF};

fn perf(args: &[&str]) -> Output {
    common::perf_output(args).0
}

/// The JSON rows of a successful run.
fn rows(args: &[&str]) -> Vec<Value> {
    common::json_rows(&perf(args))
}

#[test]
fn four_ranks_f32_all_reduce_is_exact_identical_and_aggregated() {
    let rows = rows(&common::sweep(&["allreduce", "--local-ranks", "4"]));
    assert_eq!(rows.len(), 7, "8 B .. 2 MiB by 8x");
    assert!(rows.iter().all(|r| r["ranks"] == 4 && r["codec"] == "f32"));
    // Datagrams follow the loopback MTU, capped at 32 KiB.
    let lo_mtu: usize = std::fs::read_to_string("/sys/class/net/lo/mtu")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let want = (lo_mtu - 28).min(32768);
    assert!(
        rows.iter().all(|r| r["datagram_bytes"] == want),
        "{want}-byte datagrams expected: {rows:?}"
    );
    check_rows(&rows, 1e-6, true);
    // Both algorithms ran: recursive doubling small, ring large.
    assert!(rows.iter().any(|r| r["algo"] == "rd"));
    assert!(rows.iter().any(|r| r["algo"] == "ring"));
    for r in rows
        .iter()
        .filter(|r| r["bytes"].as_u64().unwrap() >= 1 << 20)
    {
        let per_wake = r["rx_pkts_per_wakeup"].as_f64().unwrap();
        assert!(
            per_wake >= 32.0,
            "only {per_wake} packets per caller wake-up: {r}"
        );
        let busbw = r["busbw_GBs"].as_f64().unwrap();
        let algbw = r["algbw_GBs"].as_f64().unwrap();
        assert!((busbw - algbw * 1.5).abs() < 1e-9 * busbw.max(1.0), "{r}");
    }
}

#[test]
fn four_ranks_i16_all_reduce_is_within_the_documented_bound() {
    for algo in ["ring", "rd", "direct"] {
        let rows = rows(&[
            "allreduce",
            "--local-ranks",
            "4",
            "-b",
            "1K",
            "-e",
            "1M",
            "-f",
            "32",
            "-n",
            "2",
            "-w",
            "0",
            "--codec",
            "i16",
            "--algo",
            algo,
            "--udp-payload",
            "1472",
            "--json",
        ]);
        assert!(rows.iter().all(|r| r["datagram_bytes"] == 1472), "{rows:?}");
        // wrong == 0 means every element is within the crate's i16 bound.
        check_rows(&rows, 0.05, true);
        assert!(rows.iter().all(|r| r["algo"] == algo), "{rows:?}");
        assert!(
            rows.iter()
                .any(|r| r["max_rel_err"].as_f64().unwrap() > 0.0),
            "i16 should not be exact: {rows:?}"
        );
    }
}

/// The codec target: an i16 all-reduce puts at most 0.52 of the
/// f32 one's bytes on the wire (UDP payloads: messages, QUIC headers and
/// ACKs), at 1472-byte datagrams, where per-packet overhead weighs most.
#[test]
fn i16_puts_at_most_0_52_of_the_f32_bytes_on_the_wire() {
    let run = |codec: &str| {
        rows(&[
            "allreduce",
            "--local-ranks",
            "3",
            "-b",
            "8M",
            "-e",
            "8M",
            "-n",
            "8",
            "-w",
            "1",
            "--codec",
            codec,
            "--udp-payload",
            "1472",
            "--json",
        ])
    };
    let (f32_rows, i16_rows) = (run("f32"), run("i16"));
    assert_eq!(f32_rows.len(), 1);
    for (f, i) in f32_rows.iter().zip(&i16_rows) {
        assert_eq!(f["bytes"], i["bytes"]);
        let (fb, ib) = (
            f["wire_bytes_per_op"].as_f64().unwrap(),
            i["wire_bytes_per_op"].as_f64().unwrap(),
        );
        // The f32 ring sends 2(n-1)/n of the buffer per rank, plus
        // overhead. Per-op counts are deltas over the timed iterations:
        // sends still leaving at either end shift them by up to a window
        // (4% at 1 MiB and 2 iterations in one CI run, 3% at 2 MiB and 8
        // here), hence 8 MiB, 8 iterations and a margin.
        let bytes = f["bytes"].as_f64().unwrap();
        assert!(fb >= bytes * 4.0 / 3.0 * 0.95, "f32 sent only {fb} B: {f}");
        let ratio = ib / fb;
        eprintln!("{bytes} B: i16 {ib} / f32 {fb} wire bytes = {ratio:.4}");
        assert!(
            ratio <= 0.52,
            "i16/f32 wire bytes {ratio:.4} > 0.52: {i} vs {f}"
        );
    }
}

/// Rank 0 prints the rows, but every rank checks its own result: a wrong
/// element on another rank (here in a reduce-scatter, whose ranks hold
/// different shards) is counted in the row, and the run fails.
#[test]
fn a_wrong_result_on_any_rank_is_counted_and_fails_the_run() {
    for mode in ["reduce-scatter", "allreduce"] {
        let out = perf(&[
            mode,
            "--local-ranks",
            "3",
            "-b",
            "4K",
            "-e",
            "16K",
            "-f",
            "4",
            "-n",
            "1",
            "-w",
            "0",
            "--fault-corrupt-rank",
            "2",
            "--json",
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{mode}: wrong results must fail the run"
        );
        assert!(
            stderr.contains("2 wrong element(s) over all ranks"),
            "{mode}: {stderr}"
        );
        let rows: Vec<Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 2, "{mode}: {stdout}");
        for r in &rows {
            assert_eq!(r["wrong"], 1, "{mode}: rank 2's element is counted: {r}");
            assert!(r["max_rel_err"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
}

#[test]
fn other_collectives_match_their_references() {
    for (mode, identical) in [
        ("reduce-scatter", false),
        ("allgather", true),
        ("broadcast", true),
    ] {
        let rows = rows(&[
            mode,
            "--local-ranks",
            "3",
            "-b",
            "4",
            "-e",
            "1M",
            "-f",
            "16",
            "-n",
            "2",
            "-w",
            "1",
            "--json",
        ]);
        check_rows(&rows, 1e-6, identical);
    }
    let rows = rows(&[
        "allreduce",
        "--local-ranks",
        "2",
        "-b",
        "64K",
        "-e",
        "256K",
        "-f",
        "4",
        "--op",
        "max",
        "--conns-per-peer",
        "3",
        "--json",
    ]);
    check_rows(&rows, 1e-6, true);
}

/// One 64 KiB i16 reduce-scatter over 2 local ranks with `--clip clip`.
fn i16_reduce_scatter_clipped_at(clip: &str) -> Output {
    perf(&[
        "reduce_scatter",
        "--local-ranks",
        "2",
        "-b",
        "64K",
        "-e",
        "64K",
        "-n",
        "1",
        "-w",
        "0",
        "--codec",
        "i16",
        "--clip",
        clip,
        "--json",
    ])
}

/// `--clip C` reaches the engine: inputs in [-8, 8) pass a clip of 8
/// untouched, and a clip of 4 clamps them, so the run no longer matches
/// its unclipped reference and fails. (The mode is given the way,
/// `reduce_scatter`, an alias of reduce-scatter.)
#[test]
fn the_i16_clip_bound_is_applied_to_every_contribution() {
    let run = i16_reduce_scatter_clipped_at;
    let rows = common::json_rows(&run("8"));
    check_rows(&rows, 0.05, false);
    let clamped = run("4");
    let stderr = String::from_utf8_lossy(&clamped.stderr);
    assert!(
        !clamped.status.success(),
        "clamped values must miss: {stderr}"
    );
    assert!(stderr.contains("wrong element(s)"), "{stderr}");

    let f32_clip = perf(&["allreduce", "--local-ranks", "2", "--clip", "8"]);
    let stderr = String::from_utf8_lossy(&f32_clip.stderr);
    assert!(!f32_clip.status.success());
    assert!(stderr.contains("--clip applies to --codec i16"), "{stderr}");
    let zero = perf(&["allreduce", "--codec", "i16", "--clip", "0"]);
    let stderr = String::from_utf8_lossy(&zero.stderr);
    assert!(stderr.contains("not a finite number above 0"), "{stderr}");
}

/// The verdict (wrong elements, largest error, identity) is summed over
/// the ranks exactly, whatever `--codec` and `--clip` do to the data: with
/// a clip of 0.25 every rank's share of the wrong count was itself clipped
/// to 0.25 and the total read 0, and a run whose every other element was
/// wrong passed.
#[test]
fn wrong_elements_are_counted_exactly_under_i16_and_a_small_clip() {
    let out = i16_reduce_scatter_clipped_at("0.25");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "clipped results must fail: {stderr}");
    // The tool's inputs (`check::value`), clipped by each rank: an element
    // is wrong where the clipped sum misses the true one.
    let value = |r: usize, i: usize| ((i * 7 + r * 13) % 64) as f32 * 0.25 - 8.0;
    let clip = |x: f32| x.clamp(-0.25, 0.25);
    let want = (0..16384)
        .filter(|&i| {
            let (a, b) = (value(0, i), value(1, i));
            (clip(a) + clip(b) - (a + b)).abs() > 0.01
        })
        .count();
    assert!(want > 8000, "most elements are clipped: {want}");
    assert!(
        stderr.contains(&format!("{want} wrong element(s) over all ranks")),
        "want {want} wrong: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row: Value = serde_json::from_str(stdout.trim()).expect("one JSON row");
    assert_eq!(row["wrong"], want as u64, "{row}");
    assert!(row["max_rel_err"].as_f64().unwrap() > 0.5, "{row}");
}

/// A size that is not a whole number of elements moves the whole ones
/// below it, and the row says so (its bandwidth was computed on the
/// bytes asked for, up to 50% too high); sizes below one f32, or -b
/// above -e, are refused.
#[test]
fn sizes_are_whole_elements_and_impossible_ranges_are_refused() {
    for (dtype, asked, moved, count) in [("f32", "6", 4, 1), ("bf16", "5", 4, 2)] {
        let rows = rows(&[
            "allreduce",
            "--local-ranks",
            "2",
            "--dtype",
            dtype,
            "-b",
            asked,
            "-e",
            asked,
            "-n",
            "1",
            "-w",
            "0",
            "--json",
        ]);
        assert_eq!(rows[0]["bytes"], moved, "{dtype}: {}", rows[0]);
        assert_eq!(rows[0]["count"], count, "{dtype}: {}", rows[0]);
    }
    for (flags, says) in [
        (["-b", "2", "-e", "8"], "sizes must be at least 4 bytes"),
        (["-b", "8", "-e", "4"], "-b 8 is larger than -e 4"),
    ] {
        let out = perf(&[&["allreduce", "--local-ranks", "2"][..], &flags[..]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}

#[test]
fn lanes_split_large_buckets_and_keep_results_exact() {
    // Two lanes with parts of at least 256 KiB split buckets from 512 KiB
    // on; smaller ones run on lane 0.
    for codec in ["f32", "i16"] {
        let rows = rows(&common::sweep(&[
            "allreduce",
            "--local-ranks",
            "3",
            "--lanes",
            "2",
            "--lane-min-bytes",
            "256K",
            "--codec",
            codec,
        ]));
        assert_eq!(rows.len(), 7, "8 B .. 2 MiB by 8x");
        // wrong == 0: every element within 1e-6 (f32) or the i16 bound.
        let tol = if codec == "f32" { 1e-6 } else { 0.05 };
        check_rows(&rows, tol, true);
        for r in &rows {
            let want = if r["bytes"].as_u64().unwrap() >= 512 << 10 {
                2
            } else {
                1
            };
            assert_eq!(r["lanes"], want, "{r}");
        }
    }
    let rows = rows(&[
        "broadcast",
        "--local-ranks",
        "2",
        "--lanes",
        "5",
        "-b",
        "1M",
        "-e",
        "8M",
        "-f",
        "2",
        "-n",
        "2",
        "-w",
        "1",
        "--json",
    ]);
    check_rows(&rows, 1e-6, true);
    // Over as many lanes as get 1 MiB each (the default part size) once
    // that is at least 4: 4 MiB on four (the fifth keeps its traffic
    // moving), 8 MiB on all five.
    let lanes: Vec<_> = rows.iter().map(|r| r["lanes"].as_u64().unwrap()).collect();
    assert_eq!(lanes, [1, 1, 4, 5], "{rows:?}");
}

#[test]
fn reduce_scatter_and_allgather_split_over_lanes_and_keep_results_exact() {
    // Each lane carries a piece of every rank's shard; the results keep
    // the rank layout. 1 MiB over 3 ranks makes uneven shards.
    for (op, codec) in [
        ("reduce_scatter", "f32"),
        ("reduce_scatter", "i16"),
        ("allgather", "f32"),
        ("allgather", "i16"),
    ] {
        let rows = rows(&[
            op,
            "--local-ranks",
            "3",
            "--lanes",
            "2",
            "--lane-min-bytes",
            "256K",
            "--codec",
            codec,
            "-b",
            "256K",
            "-e",
            "1M",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "1",
            "--json",
        ]);
        let tol = if codec == "f32" { 1e-6 } else { 0.05 };
        // Reduce-scatter ranks hold different shards: nothing to compare.
        check_rows(&rows, tol, op == "allgather");
        let lanes: Vec<_> = rows.iter().map(|r| r["lanes"].as_u64().unwrap()).collect();
        assert_eq!(lanes, [1, 2], "{op} {codec}: {rows:?}");
    }
}

#[test]
fn ranks_spin_only_while_each_has_a_cpu() {
    // By default a rank spins 50 us before sleeping, unless the host gives
    // this run fewer CPUs than local ranks; --spin-us always wins.
    let cpus = core_affinity::get_core_ids().unwrap().len();
    let spin = |extra: &[&str]| {
        let args = [
            &[
                "allreduce",
                "--local-ranks",
                "3",
                "-b",
                "4K",
                "-e",
                "4K",
                "-n",
                "2",
                "-w",
                "0",
                "--json",
            ],
            extra,
        ]
        .concat();
        let rows = rows(&args);
        check_rows(&rows, 1e-6, true);
        rows[0]["spin_us"].as_u64().unwrap()
    };
    assert_eq!(spin(&[]), if 3 > cpus { 0 } else { 50 }, "{cpus} CPUs");
    assert_eq!(spin(&["--spin-us", "7"]), 7);
}

#[test]
fn bf16_buffers_are_reduced_within_one_rounding_on_both_codecs() {
    // Sizes are bytes of bf16: 2 bytes per element.
    // Averages of 3 ranks are not exact in bf16: they take the rounding.
    for (codec, progress, op) in [("f32", "caller", "avg"), ("i16", "thread", "sum")] {
        let rows = rows(&common::sweep(&[
            "allreduce",
            "--local-ranks",
            "3",
            "--dtype",
            "bf16",
            "--codec",
            codec,
            "--progress",
            progress,
            "--op",
            op,
        ]));
        assert_eq!(rows.len(), 7, "8 B .. 2 MiB by 8x");
        let tol = if codec == "f32" { 1.0 / 256.0 } else { 0.05 };
        check_rows(&rows, tol, true);
        for r in &rows {
            assert_eq!(r["type"], "bfloat16", "{r}");
            assert_eq!(
                r["count"].as_u64().unwrap() * 2,
                r["bytes"].as_u64().unwrap(),
                "{r}"
            );
        }
    }
}

#[test]
fn a_progress_thread_runs_the_collective_during_the_callers_computation() {
    // Each step computes (a sleep) and all-reduces 4 MiB. In the caller's
    // thread nothing moves while it computes, so the all-reduce adds its
    // whole time to the step; on a progress thread it runs during the
    // computation and almost none of it shows. The computation is sized
    // from the all-reduce's own time on this host (at least 3x), so a slow
    // or busy machine does not let the all-reduce outlast it.
    let step = |progress: &str, compute_us: u64| {
        let compute = compute_us.to_string();
        let rows = rows(&[
            "allreduce",
            "--local-ranks",
            "2",
            "-b",
            "4M",
            "-e",
            "4M",
            "-n",
            "3",
            "-w",
            "1",
            "--overlap-us",
            &compute,
            "--progress",
            progress,
            "--json",
        ]);
        check_rows(&rows, 1e-6, true);
        let r = &rows[0];
        assert_eq!(r["progress"], progress, "{r}");
        assert_eq!(r["overlap_us"], compute_us, "{r}");
        r["time_us"].as_f64().unwrap() - compute_us as f64
    };
    let alone = step("caller", 0);
    let compute = (3.0 * alone).max(50_000.0) as u64;
    let exposed_caller = step("caller", compute);
    let exposed_thread = step("thread", compute);
    assert!(
        exposed_thread < 0.5 * exposed_caller,
        "time beyond {compute} us of computation: {exposed_thread} us on a progress thread, \
         {exposed_caller} us in the caller's (the all-reduce alone: {alone} us)"
    );
}

#[test]
fn lanes_run_on_the_cpus_given() {
    // A lone rank's lanes go to the CPUs of --lcores, one each, in the
    // order given (lane k on the k-th: "1,0" puts lane 0 on CPU 1); with
    // --local-ranks, a rank's lanes go to CPUs of their own while there
    // are enough (rank i's lane k on the (i + k x ranks)-th).
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(PERF)
        .args(["allreduce", "--lanes", "2", "--lcores", "1,0"])
        .args(["-b", "4M", "-e", "4M", "-n", "2", "-w", "0", "--json"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .output()
        .unwrap();
    let lone = common::json_rows(&out);
    assert_eq!(lone[0]["lanes"], 2, "{lone:?}");
    assert_eq!(lone[0]["lane_cpus"], serde_json::json!([1, 0]), "{lone:?}");
    common::assert_two_lanes_on_their_own_cpus("udp");
}

#[test]
fn a_rank_that_dies_is_named_at_once_not_after_the_timeout() {
    // Rank 2's process exits without a word; the kernel closes its
    // sockets: its UDP port (the survivors' datagrams get ICMP port
    // unreachable) and its rendezvous connection (rank 0 tells rank 1).
    // They must name it well before their 30 s silence timeout.
    let start = Instant::now();
    let out = perf(&[
        "allreduce",
        "--local-ranks",
        "3",
        "-b",
        "1M",
        "-e",
        "1M",
        "--fault-exit-rank",
        "2",
    ]);
    // Either names it: the closed rendezvous connection after 200 ms, or
    // the closed port after 1 s of silence (a port found closed may only
    // be one a NAT moved the rank away from).
    common::assert_dead_rank_named(
        &out,
        start.elapsed(),
        Duration::from_secs(15),
        "is gone: its",
    );
}

#[test]
fn missing_environment_and_bad_dpdk_flags_are_one_line_errors() {
    let out = perf(&["allreduce"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("WORLD_SIZE") && stderr.contains("torchrun"),
        "{stderr}"
    );

    let out = Command::new(PERF)
        .args(["allreduce"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "two")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", "29500")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("WORLD_SIZE") && stderr.contains("\"two\""),
        "{stderr}"
    );
    let out = Command::new(PERF)
        .args(["allreduce"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", "29500")
        .env("AINFTP_JOB_ID", "my job")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("AINFTP_JOB_ID") && stderr.contains("not a job id"),
        "{stderr}"
    );
    // With --local-ranks the launcher says so once, before any rank runs.
    let local_ranks_refuse = |var: &str, value: &str| {
        let out = Command::new(PERF)
            .args(["allreduce", "--local-ranks", "2", "-e", "8"])
            .env(var, value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success());
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        stderr
    };
    let stderr = local_ranks_refuse("AINFTP_JOB_ID", "my job");
    assert!(
        stderr.contains("AINFTP_JOB_ID: \"my job\" is not a job id"),
        "{stderr}"
    );
    // Ranks on one host cannot all bind one fixed port.
    let stderr = local_ranks_refuse("AINFTP_BIND", "127.0.0.1:7000");
    assert!(
        stderr.contains("AINFTP_BIND=127.0.0.1:7000") && stderr.contains("127.0.0.1:0"),
        "{stderr}"
    );

    // A lone DPDK rank's flags are checked before DPDK starts: it needs a
    // port, and with lanes a port and an address per lane.
    let lone_rank = |flags: &[&str]| {
        let out = Command::new(PERF)
            .args(["allreduce", "--transport", "dpdk"])
            .args(flags)
            .env("RANK", "0")
            .env("WORLD_SIZE", "1")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", "29500")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        stderr
    };
    let stderr = lone_rank(&[]);
    assert!(
        stderr.contains("--transport dpdk needs one port"),
        "{stderr}"
    );
    let stderr = lone_rank(&["--lanes", "2", "--vdev", "net_null0", "--ip", "10.0.0.1/24"]);
    assert!(
        stderr.contains("--lanes 2 on --transport dpdk needs 2 ports") && stderr.contains("not 1"),
        "{stderr}"
    );
    // Lanes on --lcores take one CPU each, checked before anything starts.
    let stderr = lone_rank(&["--lanes", "2", "--lcores", "0"]);
    assert!(stderr.contains("names 1 CPU(s) for 2 lane(s)"), "{stderr}");
    let stderr = lone_rank(&[
        "--lanes",
        "2",
        "--vdev",
        "net_null0",
        "--vdev",
        "net_null1",
        "--ip",
        "10.0.0.1/24",
    ]);
    assert!(
        stderr.contains("one --ip ADDR/PREFIX per port: 2 port(s), 1 --ip"),
        "{stderr}"
    );
    // Refused by the launcher in one line, before anything is created.
    let refused = |args: &[&str]| {
        let out = perf(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success());
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        stderr
    };
    let local_dpdk = ["allreduce", "--local-ranks", "2", "--transport", "dpdk"];
    let stderr = refused(&[&local_dpdk[..], &["--mbuf-arena", "--lanes", "2"]].concat());
    assert!(
        stderr.contains("--mbuf-arena runs with one lane"),
        "{stderr}"
    );

    // Local DPDK ranks get their ports from us; a port of the user's is
    // refused before anything is created.
    let stderr = refused(&[&local_dpdk[..], &["--vdev", "net_null0"]].concat());
    assert!(stderr.contains("--vdev is chosen per rank"), "{stderr}");
    // So is a gateway: the ranks' virtual network has none.
    let stderr = refused(&[&local_dpdk[..], &["--gateway", "10.98.0.1"]].concat());
    assert!(stderr.contains("--gateway is chosen per rank"), "{stderr}");

    // Local ranks get their CPUs from the launcher.
    let stderr = refused(&["allreduce", "--local-ranks", "2", "--lcores", "0"]);
    assert!(
        stderr.contains("--lcores is chosen per rank with --local-ranks"),
        "{stderr}"
    );

    // The arena holds our DPDK stack's buffers: kernel UDP has none.
    let stderr = refused(&["allreduce", "--local-ranks", "2", "--mbuf-arena"]);
    assert!(
        stderr.contains("--mbuf-arena") && stderr.contains("--transport dpdk"),
        "{stderr}"
    );
}

/// A member of the cluster cannot pose as another rank: rank 0 given
/// rank 2's certificate (valid, from the cluster CA) says "rank 0" in its
/// hello, and rank 1 refuses it because the certificate names rank2.
#[test]
fn a_rank_may_only_claim_the_rank_its_certificate_names() {
    let dir = tempfile::tempdir().unwrap();
    common::make_cluster(dir.path(), &["rank0", "rank1", "rank2"]);
    for ext in ["pem", "key"] {
        let from = dir.path().join(format!("rank2.{ext}"));
        std::fs::copy(from, dir.path().join(format!("rank0.{ext}"))).unwrap();
    }
    let out = perf(&[
        "allreduce",
        "--local-ranks",
        "2",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "1",
        "-w",
        "0",
        "--connect-timeout",
        "3",
        "--certs",
        dir.path().to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a rank posed as another: {stderr}");
    assert!(
        stderr.contains("hello claims rank 0") && stderr.contains("[\"rank2\"]"),
        "{stderr}"
    );
}

/// Mutual TLS between ranks: with `--certs DIR`, rank R presents the node
/// `rankR` of DIR and checks every peer against DIR's CA. A rank whose
/// certificate comes from another cluster is refused, and the error says
/// why; a missing rank's files are named before anything starts.
#[test]
fn with_cluster_certificates_every_rank_proves_membership() {
    let ours = tempfile::tempdir().unwrap();
    let theirs = tempfile::tempdir().unwrap();
    for dir in [&ours, &theirs] {
        common::make_cluster(dir.path(), &["rank0", "rank1"]);
    }
    let d = ours.path().to_str().unwrap();
    let run = |ranks: &str| {
        perf(&[
            "allreduce",
            "--local-ranks",
            ranks,
            "-b",
            "1K",
            "-e",
            "64K",
            "-f",
            "8",
            "-n",
            "2",
            "-w",
            "1",
            "--connect-timeout",
            "3",
            "--certs",
            d,
            "--json",
        ])
    };
    check_rows(&common::json_rows(&run("2")), 1e-6, true);

    let missing = run("3");
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success());
    assert!(stderr.contains("no rank2.pem for rank 2"), "{stderr}");

    for f in ["rank1.pem", "rank1.key"] {
        std::fs::copy(theirs.path().join(f), ours.path().join(f)).unwrap();
    }
    let foreign = run("2");
    let stderr = String::from_utf8_lossy(&foreign.stderr);
    assert!(!foreign.status.success(), "a foreign rank got in: {stderr}");
    assert!(
        stderr.contains("TLS alert") && stderr.contains("same cluster CA"),
        "{stderr}"
    );
}

#[test]
fn the_memory_check_holds_what_a_bf16_run_takes() {
    // The check refuses sizes that do not fit this machine; its estimate
    // per byte was f32's for bf16 too, which holds about twice as much
    // (its buffers but the bucket are f32), so a size it let through
    // could abort a rank in the allocator. The peak RSS of the largest
    // process (ranks are this test's grandchildren, waited for by the
    // launcher), as it grows from one size to another, must stay within
    // the estimate and past f32's. (The growth, since a process's fixed
    // memory weighs on small sizes.)
    use nix::sys::resource::{getrusage, UsageWho};
    use tools::perf::args::CollDtype;
    use tools::perf::coll::memory_per_byte;
    let peak_after = |size: &str| {
        let out = perf(&[
            "allreduce",
            "--local-ranks",
            "2",
            "--dtype",
            "bf16",
            "-b",
            size,
            "-e",
            size,
            "-n",
            "1",
            "-w",
            "0",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The largest so far, of every child waited for.
        getrusage(UsageWho::RUSAGE_CHILDREN).unwrap().max_rss() * 1024
    };
    let small = peak_after("8M");
    let big = peak_after("40M");
    let per_byte = (big - small) as f64 / (32 << 20) as f64;
    eprintln!("bf16: a rank's peak RSS grew by {per_byte:.2}x the size");
    assert!(
        per_byte <= memory_per_byte(CollDtype::Bf16) as f64,
        "a rank grew by {per_byte:.1}x the size"
    );
    assert!(
        per_byte > memory_per_byte(CollDtype::F32) as f64,
        "the case this test is about: {per_byte:.1}x"
    );
}
