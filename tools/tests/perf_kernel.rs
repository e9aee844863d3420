//! The kernel-socket baselines of ainftp-perf end to end: `udp-echo` with
//! `udp-pingpong` (the latency rows of bench-stack.sh) and `tcp-server`
//! with `tcp-client` (the TCP row of bench-quic.sh), on loopback.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr, Command, Stdio};

const PERF: &str = env!("CARGO_BIN_EXE_ainftp-perf");

/// A server mode on 127.0.0.1:0, and the address it says it bound.
fn start_server(mode: &str, says: &str) -> (Child, BufReader<ChildStderr>, String) {
    start_server_with(mode, says, &["--duration", "60"])
}

fn start_server_with(
    mode: &str,
    says: &str,
    flags: &[&str],
) -> (Child, BufReader<ChildStderr>, String) {
    let mut child = Command::new(PERF)
        .args([mode, "--bind", "127.0.0.1:0", "--json"])
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ainftp-perf");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 {
            break None;
        }
        if let Some(rest) = line.split(says).nth(1) {
            break rest.split_whitespace().next().map(str::to_string);
        }
    };
    match addr {
        Some(addr) => (child, stderr, addr),
        None => {
            let status = child.wait();
            panic!("{mode} exited ({status:?}) before saying where it listens");
        }
    }
}

/// SIGINT, then the server's exit status and its JSON summary.
fn stop_server(mut child: Child) -> serde_json::Value {
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    serde_json::from_str(out.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {out}"))
}

fn run_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(PERF).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    // With --json, stdout is the JSON object alone (the human summary
    // goes to stderr), so `| jq` works.
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {stdout}"))
}

#[test]
fn pingpong_against_the_echo_counts_every_round_trip_in_ordered_percentiles() {
    let (echo, _stderr, addr) = start_server("udp-echo", "udp echo on ");
    let j = run_json(&[
        "udp-pingpong",
        "--target",
        &addr,
        "--count",
        "300",
        "--warmup",
        "20",
        "--size",
        "200",
        "--json",
    ]);
    assert_eq!(j["mode"], "udp-pingpong");
    assert_eq!(j["count"], 300, "{j}");
    assert_eq!(j["lost"], 0, "{j}");
    assert_eq!(j["size"], 200, "{j}");
    let q = |k: &str| j[k].as_f64().unwrap_or_else(|| panic!("{k} in {j}"));
    assert!(q("p50_us") > 0.0, "{j}");
    assert!(
        q("p50_us") <= q("p99_us") && q("p99_us") <= q("p999_us") && q("p999_us") <= q("max_us"),
        "{j}"
    );
    // Loopback round trips: far below the 1 s a probe may take.
    assert!(q("p50_us") < 100_000.0, "{j}");
    // Past a 1500-byte MTU too (the echo dropped these unanswered).
    let big = run_json(&[
        "udp-pingpong",
        "--target",
        &addr,
        "--count",
        "50",
        "--warmup",
        "0",
        "--size",
        "65000",
        "--json",
    ]);
    assert_eq!(
        (big["count"].as_u64(), big["lost"].as_u64()),
        (Some(50), Some(0)),
        "{big}"
    );

    let summary = stop_server(echo);
    // Every probe, warm-up included, came in once and went back once.
    assert_eq!(summary["rx"], 370, "{summary}");
    assert_eq!(summary["tx"], 370, "{summary}");
    assert_eq!(summary["drops"], 0, "{summary}");
}

#[test]
fn probes_lost_in_the_warm_up_are_not_counted_as_lost() {
    // An echo that ignores the first 3 probes (all in the warm-up of 5),
    // then answers every one.
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap().to_string();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        for n in 0..3 + 2 + 10 {
            let (len, from) = sock.recv_from(&mut buf).unwrap();
            if n >= 3 {
                sock.send_to(&buf[..len], from).unwrap();
            }
        }
    });
    let j = run_json(&[
        "udp-pingpong",
        "--target",
        &addr,
        "--count",
        "10",
        "--warmup",
        "5",
        "--json",
    ]);
    echo.join().unwrap();
    assert_eq!(
        (&j["count"], &j["lost"], &j["warmup_lost"]),
        (&10.into(), &0.into(), &3.into()),
        "{j}"
    );
}

#[test]
fn tcp_bulk_is_counted_by_the_server_on_every_connection() {
    let (server, _stderr, addr) = start_server("tcp-server", "tcp server on ");
    let j = run_json(&[
        "tcp-client",
        "--target",
        &addr,
        "--bytes",
        "20000000",
        "--conns",
        "3",
        "--json",
    ]);
    // The client fails unless the server counted every byte it sent.
    assert_eq!(j["bytes"], 60_000_000u64, "{j}");
    assert_eq!(j["conns"], 3, "{j}");
    assert!(j["gbps"].as_f64().unwrap() > 0.0, "{j}");
    assert_eq!(stop_server(server)["connections"], 3);
}

#[test]
fn tcp_client_against_no_server_fails_with_the_target_named() {
    // A port nobody listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let target = format!("127.0.0.1:{port}");
    let out = Command::new(PERF)
        .args(["tcp-client", "--target", &target, "--bytes", "1000"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&target), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Servers run until they are told to stop, as iperf3 -s does: they used
/// to leave after 10 s by default, in the middle of a client's run.
#[test]
fn servers_without_a_duration_run_until_a_signal() {
    let (echo, _stderr, addr) = start_server_with("udp-echo", "udp echo on ", &[]);
    std::thread::sleep(std::time::Duration::from_secs(11));
    let j = run_json(&[
        "udp-pingpong",
        "--target",
        &addr,
        "--count",
        "10",
        "--warmup",
        "0",
        "--json",
    ]);
    assert_eq!(j["lost"], 0, "{j}");
    let summary = stop_server(echo);
    assert_eq!(summary["rx"], 10, "{summary}");
}

#[test]
fn tcp_client_against_a_peer_that_never_answers_gives_up_after_its_timeout() {
    // A listener that accepts and reads to the end but never writes the
    // count back (a paused server, another service): the client waited
    // for the answer for ever.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            let mut r = s.try_clone().unwrap();
            held.push(s);
            std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
        }
    });
    let start = std::time::Instant::now();
    let mut client = Command::new(PERF)
        .args(["tcp-client", "--target", &target, "--bytes", "1000"])
        .args(["--connect-timeout", "1"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while client.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(5) {
            let _ = client.kill();
            let _ = client.wait();
            panic!("tcp-client still waiting after 5 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = client.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("nothing moved for 1 s (--connect-timeout)") && stderr.contains(&target),
        "{stderr}"
    );
}

#[test]
fn a_pingpong_whose_echo_goes_away_reports_what_it_measured_and_fails() {
    // The echo ends after a second, long before the count is done: the
    // run threw away every round trip it had timed.
    let (echo, _stderr, addr) = start_server_with("udp-echo", "udp echo on ", &["--duration", "1"]);
    let out = Command::new(PERF)
        .args(["udp-pingpong", "--target", &addr, "--count", "100000000"])
        .args(["--warmup", "0", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let j: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {stdout} {stderr}"));
    assert!(j["count"].as_u64().unwrap() > 0, "{j}");
    assert_eq!(j["ended_early"], true, "{j}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains(&addr) && !stderr.contains("panicked"),
        "{stderr}"
    );
    drop(echo);
}
