//! Running ainftp-perf's collective modes from tests.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};

use serde_json::Value;

pub const PERF: &str = env!("CARGO_BIN_EXE_ainftp-perf");

/// The size sweep the collective tests share: 8 B .. 2 MiB by 8x (7
/// rows), 3 timed iterations after 1 warm-up, JSON rows; after `args`.
pub fn sweep<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let sizes = [
        "-b", "8", "-e", "4M", "-f", "8", "-n", "3", "-w", "1", "--json",
    ];
    [args, &sizes[..]].concat()
}

/// Runs ainftp-perf outside any torchrun environment; also returns its
/// pid (a DPDK run's virtual network carries it in its names).
pub fn perf_output(args: &[&str]) -> (Output, u32) {
    let child = Command::new(PERF)
        .args(args)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("MASTER_ADDR")
        .env_remove("MASTER_PORT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ainftp-perf");
    let pid = child.id();
    (child.wait_with_output().expect("wait for ainftp-perf"), pid)
}

/// The JSON rows of a run that must have succeeded.
pub fn json_rows(out: &Output) -> Vec<Value> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed: {stderr}\n{stdout}");
    let rows: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(!rows.is_empty(), "no rows: {stderr}");
    rows
}

/// Every row has no wrong element and an error within `max_err`; with
/// `identical`, every rank's result was bit-identical.
pub fn check_rows(rows: &[Value], max_err: f64, identical: bool) {
    for r in rows {
        assert_eq!(r["wrong"], 0, "{r}");
        let err = r["max_rel_err"].as_f64().unwrap();
        assert!(err <= max_err, "error {err} above {max_err}: {r}");
        if identical {
            assert_eq!(r["identical"], true, "ranks differ: {r}");
        }
    }
}

/// A run where rank 2 exited on purpose (`--fault-exit-rank 2`) failed
/// within `limit`, without a panic; a survivor named rank 2 with a
/// message containing `how` (how its death was found), and both
/// survivors blame it.
pub fn assert_dead_rank_named(
    out: &Output,
    took: std::time::Duration,
    limit: std::time::Duration,
    how: &str,
) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(took < limit, "took {took:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("rank 2") && l.contains(how)),
        "the survivors name the dead rank: {stderr}"
    );
    // Both survivors blame rank 2: one that found it gone itself, the
    // other the same way or through that one's goodbye, which names the
    // cause.
    let blames: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("is gone") || l.contains("left after"))
        .collect();
    assert_eq!(blames.len(), 2, "{stderr}");
    assert!(blames.iter().all(|l| l.contains("rank 2")), "{stderr}");
}

/// One local rank with two lanes on `transport`: lane k runs on the k-th
/// CPU this process may use (so each lane has a CPU of its own where
/// there are two).
pub fn assert_two_lanes_on_their_own_cpus(transport: &str) {
    let (out, _) = perf_output(&[
        "allreduce",
        "--local-ranks",
        "1",
        "--transport",
        transport,
        "--lanes",
        "2",
        "-b",
        "4M",
        "-e",
        "4M",
        "-n",
        "2",
        "-w",
        "0",
        "--json",
    ]);
    let row = &json_rows(&out)[0];
    let allowed: Vec<usize> = core_affinity::get_core_ids()
        .unwrap()
        .iter()
        .map(|c| c.id)
        .collect();
    let want = [allowed[0], allowed[1 % allowed.len()]];
    assert_eq!(row["lanes"], 2, "{row}");
    assert_eq!(row["lane_cpus"], serde_json::json!(want), "{row}");
}

/// Runs `cmd` with its stdout and stderr closed from the start, as a
/// reader that went away (`| head`) leaves them; how it exited.
pub fn exit_with_closed_pipes(mut cmd: Command) -> std::process::ExitStatus {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the binary");
    drop(child.stdout.take());
    drop(child.stderr.take());
    child.wait().expect("wait for the binary")
}

/// A cluster CA and node certificates in `dir`, made the way a user makes
/// them: `ainftp-dp certs --dir DIR --ca --node N ...`.
pub fn make_cluster(dir: &std::path::Path, nodes: &[&str]) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ainftp-dp"));
    cmd.args(["certs", "--dir", dir.to_str().unwrap(), "--ca"]);
    for n in nodes {
        cmd.args(["--node", n]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
