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
fn links_left(pid: u32) -> Vec<String> {
    let out = Command::new("ip").args(["-br", "link"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split([' ', '@']).next())
        .filter(|n| n.starts_with(&format!("ac{pid}")))
        .map(str::to_string)
        .collect()
}

#[test]
fn four_dpdk_ranks_all_reduce_exact_identical_and_aggregated() {
    let (out, pid) = perf(&[
        "allreduce",
        "--local-ranks",
        "4",
        "--transport",
        "dpdk",
        "-b",
        "8",
        "-e",
        "4M",
        "-f",
        "8",
        "-n",
        "3",
        "-w",
        "1",
        "--json",
    ]);
    let rows = json_rows(&out);
    assert_eq!(rows.len(), 7, "8 B .. 2 MiB by 8x: {rows:?}");
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
    assert_eq!(
        links_left(pid),
        Vec::<String>::new(),
        "virtual network left behind"
    );
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
        "--timeout",
        "2",
        "--fault-exit-rank",
        "2",
    ]);
    common::assert_dead_rank_named(&out, start.elapsed(), Duration::from_secs(40));
    assert_eq!(
        links_left(pid),
        Vec::<String>::new(),
        "virtual network left behind"
    );
}
