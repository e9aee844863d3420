//! ainftp-perf's collectives over our DPDK stack: `--local-ranks N
//! --transport dpdk` builds a bridge with a veth per rank, each rank runs
//! the stack on net_af_xdp over its veth (net_af_packet with
//! `--mbuf-arena`). Reference results, bit-identical
//! ranks, data-plane aggregation, a dead peer, and the virtual network
//! removed afterwards. Needs root (CI is root).

use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{check_rows, json_rows, perf_output as perf};

/// Links whose names our run `pid` would have given (`ac<pid>...`).
/// Links and network namespaces of run `pid` still there.
fn links_left(pid: u32) -> Vec<String> {
    let names = |args: &[&str]| {
        let out = Command::new("ip").args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split([' ', '@']).next())
            // `ac<pid>` then a letter: run 123 is not run 1234.
            .filter(|n| {
                n.strip_prefix(&format!("ac{pid}"))
                    .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_alphabetic()))
            })
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    [names(&["-br", "link"]), names(&["netns", "list"])].concat()
}

/// The rows of a `common::sweep` run (8 B .. 2 MiB by 8x) with `args`,
/// after checking that the run left no virtual network behind.
fn dpdk_sweep(args: &[&str]) -> Vec<serde_json::Value> {
    let (out, pid) = perf(&common::sweep(args));
    let rows = json_rows(&out);
    assert_eq!(
        links_left(pid),
        Vec::<String>::new(),
        "virtual network left behind"
    );
    assert_eq!(rows.len(), 7, "8 B .. 2 MiB by 8x: {rows:?}");
    rows
}

#[test]
fn four_dpdk_ranks_all_reduce_exact_identical_and_aggregated() {
    let rows = dpdk_sweep(&["allreduce", "--local-ranks", "4", "--transport", "dpdk"]);
    assert!(rows.iter().all(|r| r["ranks"] == 4), "{rows:?}");
    // The virtual links take af_xdp's largest MTU, 3438: datagrams of
    // 3410 B, received whole into our mbufs.
    assert!(rows.iter().all(|r| r["datagram_bytes"] == 3410), "{rows:?}");
    check_rows(&rows, 1e-6, true);
    assert!(rows.iter().any(|r| r["algo"] == "rd"));
    assert!(rows.iter().any(|r| r["algo"] == "ring"));
    for r in rows
        .iter()
        .filter(|r| r["bytes"].as_u64().unwrap() >= 1 << 20)
    {
        let per_wake = r["rx_pkts_per_wakeup"].as_f64().unwrap();
        assert!(per_wake >= 32.0, "only {per_wake} packets per wake-up: {r}");
    }
}

#[test]
fn dpdk_lanes_split_large_buckets_over_their_own_ports() {
    // Two lanes per rank: each on its own af_xdp port (10.98.k.0/24),
    // with its own QUIC connections and thread. Buckets from 2 x 1 MiB
    // on are cut in two, one half per lane; smaller ones run on lane 0.
    let rows = dpdk_sweep(&[
        "allreduce",
        "--local-ranks",
        "2",
        "--transport",
        "dpdk",
        "--lanes",
        "2",
    ]);
    check_rows(&rows, 1e-6, true);
    for r in &rows {
        let bytes = r["bytes"].as_u64().unwrap();
        let sent: Vec<f64> = r["lane_wire_bytes_per_op"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_f64().unwrap())
            .collect();
        assert_eq!(sent.len(), 2, "{r}");
        let total: f64 = sent.iter().sum();
        if bytes >= 2 << 20 {
            assert_eq!(r["lanes"], 2, "{r}");
            // Each lane carries its half of the bucket over its own port.
            for s in &sent {
                assert!(*s > 0.4 * total, "lanes unbalanced: {r}");
            }
        } else {
            assert_eq!(r["lanes"], 1, "{r}");
            assert!(sent[0] > 0.0, "{r}");
        }
    }
}

#[test]
fn dpdk_ranks_on_progress_threads_all_reduce_exact() {
    // The stack (the EAL's lcore queue) is driven from the progress
    // thread, not the thread that opened it.
    let rows = dpdk_sweep(&[
        "allreduce",
        "--local-ranks",
        "2",
        "--transport",
        "dpdk",
        "--progress",
        "thread",
        "--overlap-us",
        "2000",
    ]);
    check_rows(&rows, 1e-6, true);
    assert!(rows.iter().all(|r| r["progress"] == "thread"), "{rows:?}");
}

#[test]
fn dpdk_lanes_get_cpus_of_their_own() {
    // EAL pins lane 0's thread; the other lanes must still get CPUs of
    // their own (one rank: lane k on the k-th allowed CPU).
    common::assert_two_lanes_on_their_own_cpus("dpdk");
}

#[test]
fn four_dpdk_ranks_i16_and_other_collectives_match_references() {
    let (out, _) = perf(&[
        "allreduce",
        "--local-ranks",
        "4",
        "--transport",
        "dpdk",
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
        "--json",
    ]);
    let rows = json_rows(&out);
    for r in &rows {
        // wrong == 0: every element within the crate's documented i16 bound.
        assert_eq!(r["wrong"], 0, "{r}");
        assert_eq!(r["identical"], true, "{r}");
        assert_eq!(r["codec"], "i16", "{r}");
    }
    for mode in ["reduce-scatter", "allgather", "broadcast"] {
        let (out, _) = perf(&[
            mode,
            "--local-ranks",
            "3",
            "--transport",
            "dpdk",
            "-b",
            "4K",
            "-e",
            "256K",
            "-f",
            "64",
            "-n",
            "2",
            "-w",
            "0",
            "--json",
        ]);
        for r in json_rows(&out) {
            assert_eq!(r["mode"], mode, "{r}");
            assert_eq!(r["wrong"], 0, "{r}");
        }
    }
}

#[test]
fn ranks_with_arena_buffers_over_af_packet_all_reduce_exact() {
    let (out, pid) = perf(&[
        "allreduce",
        "--local-ranks",
        "3",
        "--transport",
        "dpdk",
        "--mbuf-arena",
        "-b",
        "16",
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
    let rows = json_rows(&out);
    assert_eq!(rows.len(), 5, "16 B .. 1 MiB by 16x: {rows:?}");
    check_rows(&rows, 1e-6, true);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let arenas = stderr
        .lines()
        .filter(|l| l.contains("mbufs in an arena at") && l.contains("registered with DPDK"))
        .count();
    assert_eq!(arenas, 3, "each rank's buffers in its arena: {stderr}");
    assert_eq!(
        links_left(pid),
        Vec::<String>::new(),
        "virtual network left behind"
    );
}

#[test]
fn dead_dpdk_rank_is_a_clear_error_and_the_network_is_removed() {
    let start = Instant::now();
    let (out, pid) = perf(&[
        "allreduce",
        "--local-ranks",
        "3",
        "--transport",
        "dpdk",
        "-b",
        "1M",
        "-e",
        "1M",
        "--fault-exit-rank",
        "2",
    ]);
    // Nothing on the DPDK path answers for the dead rank's address; its
    // rendezvous connection closes, and rank 0 tells the other survivor.
    // Both must name it well before the 30 s silence timeout.
    common::assert_dead_rank_named(
        &out,
        start.elapsed(),
        Duration::from_secs(15),
        "closed without a goodbye",
    );
    assert_eq!(
        links_left(pid),
        Vec::<String>::new(),
        "virtual network left behind"
    );
}

/// An nftables table in this (the host's) namespace, deleted on drop.
struct HostFirewall(&'static str);

impl HostFirewall {
    fn add(name: &'static str, rules: &str) -> HostFirewall {
        let _ = Command::new("nft")
            .args(["delete", "table", "bridge", name])
            .status();
        let script = format!("table bridge {name} {{\n{rules}\n}}\n");
        let ok = Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin
                    .take()
                    .expect("stdin")
                    .write_all(script.as_bytes())?;
                c.wait()
            });
        assert!(ok.map(|s| s.success()).unwrap_or(false), "nft -f: {script}");
        HostFirewall(name)
    }
}

impl Drop for HostFirewall {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "bridge", self.0])
            .status();
    }
}

#[test]
fn a_host_firewall_that_drops_bridged_frames_does_not_reach_the_ranks() {
    // A host firewall that drops what its bridges forward (an nftables
    // bridge-family rule, here only for ports named like ours, so no other
    // bridge on the machine is touched). The ranks' bridge lives in a
    // namespace of its own, where the host's rules do not run.
    let _fw = HostFirewall::add(
        "ainftp_test_fw",
        "chain block { type filter hook forward priority 0; iifname \"ac*\" counter drop; }",
    );
    let (out, pid) = perf(&[
        "allreduce",
        "--local-ranks",
        "2",
        "--transport",
        "dpdk",
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
        "--timeout",
        "5",
        "--json",
    ]);
    let rows = json_rows(&out);
    assert_eq!(rows.len(), 3, "1 KiB .. 64 KiB by 8x: {rows:?}");
    check_rows(&rows, 1e-6, true);
    assert_eq!(
        links_left(pid),
        Vec::<String>::new(),
        "virtual network left behind"
    );
}

/// Ctrl-C at any point of a local DPDK run (building the virtual network,
/// starting the ranks, mid-run) stops the ranks and removes the network:
/// the handler used to be installed only after the network was built, so
/// a signal meanwhile killed the tool and left its links and namespaces.
#[test]
fn an_interrupted_dpdk_run_leaves_no_virtual_network_whenever_the_signal_comes() {
    for delay_ms in [30, 120, 400, 2000] {
        let mut child = Command::new(common::PERF)
            .args(["allreduce", "--local-ranks", "3", "--lanes", "2"])
            .args([
                "--transport",
                "dpdk",
                "-b",
                "16M",
                "-e",
                "16M",
                "-n",
                "1000",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let pid = child.id();
        Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .unwrap();
        let t = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{delay_ms} ms: still running 30 s after SIGINT"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            !status.success(),
            "{delay_ms} ms: an interrupted run succeeded"
        );
        assert_eq!(
            links_left(pid),
            Vec::<String>::new(),
            "{delay_ms} ms: virtual network left behind"
        );
    }
}
