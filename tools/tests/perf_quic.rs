//! ainftp-perf's QUIC modes end to end: over kernel UDP on loopback, a
//! bulk transfer and a request/response run against the perf server (the
//! UDP payload follows the route, loopback's 64 KiB MTU capped at 32 KiB,
//! unless --max-payload says otherwise); and a client on our DPDK stack
//! spread over two lcores, each connection's port picked so that its
//! replies come back to the lcore that owns it.

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const PERF: &str = env!("CARGO_BIN_EXE_ainftp-perf");

struct Server(Child);

impl Server {
    fn start(port: u16) -> Server {
        Server::start_on(&format!("127.0.0.1:{port}"))
    }

    fn start_on(bind: &str) -> Server {
        Server::start_with(bind, &[])
    }

    fn start_with(bind: &str, extra: &[&str]) -> Server {
        let child = Command::new(PERF)
            .args(["quic-server", "--transport", "udp", "--duration", "120"])
            .args(["--bind", bind])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the quic server");
        // The client retries its Initial, but give the bind a moment.
        std::thread::sleep(Duration::from_millis(300));
        Server(child)
    }
}

/// Stops the server as a user would (SIGTERM), so it exits cleanly and
/// removes its throwaway certificates; SIGKILL if it does not within 10 s.
impl Drop for Server {
    fn drop(&mut self) {
        let pid = self.0.id();
        let _ = Command::new("sh")
            .args(["-c", &format!("kill -TERM {pid}")])
            .status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn client(port: u16, args: &[&str]) -> (serde_json::Value, String) {
    let out: Output = Command::new(PERF)
        .args([
            "quic-client",
            "--connect-timeout",
            "30",
            "--transport",
            "udp",
            "--json",
        ])
        .args(["--target", &format!("127.0.0.1:{port}")])
        .args(args)
        .output()
        .expect("run the quic client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "client failed: {stderr}");
    // With --json, stdout is the JSON object alone.
    let json = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {stdout}"));
    (json, stderr)
}

#[test]
fn bulk_and_request_response_against_the_perf_server_with_route_sized_datagrams() {
    let port = 24_433;
    let _server = Server::start(port);

    let (bulk, stderr) = client(port, &["--bytes", "20000000", "--streams", "2"]);
    // --bytes is per stream.
    assert_eq!(bulk["bytes"], 40_000_000, "{bulk}");
    assert!(bulk["gbps"].as_f64().unwrap() > 0.0, "{bulk}");
    // The connection's own counts: at least one 32 KiB datagram per
    // 32 KiB of data, a loss count, a measured round trip.
    let sent = bulk["packets_sent"].as_u64().unwrap();
    assert!(sent >= 40_000_000 / 32_768, "{bulk}");
    assert!(bulk["packets_lost"].as_u64().unwrap() < sent, "{bulk}");
    assert!(bulk["rtt_us"].as_f64().unwrap() > 0.0, "{bulk}");
    // Path MTU discovery starts at 1200 bytes and finds that loopback
    // carries more than any Ethernet (quiche reports at most 16383).
    let found = bulk["max_datagram"].as_u64().unwrap();
    assert!((1473..=16_383).contains(&found), "{bulk}");
    assert!(
        stderr.contains("UDP payloads up to 32768 B"),
        "loopback route: 32 KiB datagrams: {stderr}"
    );

    let (rr, stderr) = client(
        port,
        &[
            "--test",
            "rr",
            "--count",
            "500",
            "--warmup",
            "50",
            "--size",
            "64",
            "--max-payload",
            "1200",
        ],
    );
    assert_eq!(rr["requests"], 500, "{rr}");
    let (p50, p99) = (
        rr["p50_us"].as_f64().unwrap(),
        rr["p99_us"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p99, "{rr}");
    assert_eq!(rr["max_datagram"], 1200, "{rr}");
    assert!(
        stderr.contains("UDP payloads up to 1200 B"),
        "--max-payload is taken as given: {stderr}"
    );

    // Congestion control and pacing are the client's to choose.
    let (paced, stderr) = client(port, &["--bytes", "5000000", "--cc", "bbr2", "--pacing"]);
    assert_eq!(paced["bytes"], 5_000_000, "{paced}");
    assert!(
        stderr.contains("QUIC congestion control bbr2, pacing on"),
        "{stderr}"
    );

    // Over several connections the requests take them in turn.
    let (rr, _) = client(
        port,
        &[
            "--test", "rr", "--count", "300", "--warmup", "30", "--conns", "3",
        ],
    );
    assert_eq!(rr["requests"], 300, "{rr}");
    assert_eq!(
        rr["requests_by_conn"],
        serde_json::json!([100, 100, 100]),
        "{rr}"
    );
}

fn sh(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", cmd])
        .status()
        .expect("run sh")
        .success()
}

/// Without --certs both ends make a throwaway certificate; its files are
/// gone when each process exits (each gets its own empty TMPDIR to check).
#[test]
fn throwaway_certificates_are_removed_when_the_perf_tools_exit() {
    let port = 24_438;
    let tmp = std::env::temp_dir().join(format!("ainftp-certs-test-{}", std::process::id()));
    let (server_tmp, client_tmp) = (tmp.join("server"), tmp.join("client"));
    for d in [&server_tmp, &client_tmp] {
        std::fs::create_dir_all(d).unwrap();
    }
    let server = Command::new(PERF)
        .args(["quic-server", "--transport", "udp", "--duration", "3"])
        .args(["--bind", &format!("127.0.0.1:{port}")])
        .env("TMPDIR", &server_tmp)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the quic server");
    let mut server = Server(server);
    std::thread::sleep(Duration::from_millis(300));
    let out = Command::new(PERF)
        .args([
            "quic-client",
            "--connect-timeout",
            "30",
            "--transport",
            "udp",
            "--json",
        ])
        .args([
            "--target",
            &format!("127.0.0.1:{port}"),
            "--bytes",
            "100000",
        ])
        .env("TMPDIR", &client_tmp)
        .output()
        .expect("run the quic client");
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = server.0.wait().expect("wait for the server");
    assert!(status.success(), "server exited with {status}");
    for d in [&server_tmp, &client_tmp] {
        let left: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "left in {}: {left:?}", d.display());
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// A DPDK client on net_tap over two lcores: 4 connections, 2 per lcore,
/// every byte counted by the kernel-socket server, no packet left at an
/// lcore that does not own its connection. With software steering the
/// client picks ports whose replies hash to their lcore; with a queue per
/// lcore (auto: net_tap has RSS) the kernel picks the queue, and a reply
/// that reaches the other lcore is handed over by connection ID. (On
/// net_tap that rarely happens: the kernel sends a flow's replies to the
/// queue that last sent on it, the owner's. What this checks is that the
/// client runs there; `stack/tests/quic_handoff.rs` forces hand-offs.)
#[test]
fn dpdk_client_on_two_lcores_keeps_each_connection_on_its_own_lcore() {
    let port = 24_435;
    let _server = Server::start_on(&format!("0.0.0.0:{port}"));
    // One run at a time (both use 10.70.0 on their TAP), each with its own
    // TAP name: the last run's device may still be going away.
    for (steering, iface) in [("auto", "ainfpq1"), ("software", "ainfpq0")] {
        let child = Command::new(PERF)
            .args([
                "quic-client",
                "--connect-timeout",
                "30",
                "--transport",
                "dpdk",
                "--json",
                "--lcores",
                "0-1",
            ])
            .args(["--vdev", &format!("net_tap_pq0,iface={iface}")])
            .args(["--ip", "10.70.0.2/24", "--steering", steering])
            .args(["--target", &format!("10.70.0.1:{port}")])
            .args(["--conns", "4", "--streams", "2", "--bytes", "3000000"])
            .args(["--", "--in-memory"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the dpdk quic client");
        // The kernel side of the tap gets its address once DPDK made it;
        // the client's Initials are retransmitted until then.
        let t0 = std::time::Instant::now();
        while !sh(&format!(
            "ip addr add 10.70.0.1/24 dev {iface} 2>/dev/null && ip link set {iface} up"
        )) {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{iface} never appeared"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{steering}: client failed: {stderr}");
        let json: serde_json::Value =
            serde_json::from_str(stdout.lines().last().unwrap_or_default())
                .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {stdout}"));
        assert_eq!(json["bytes"], 4 * 2 * 3_000_000, "{steering}: {json}");
        assert_eq!(json["lcores"], 2, "{json}");
        // Each connection's goodput, measured on its own: all four moved
        // data, and together they are the total.
        let by_conn: Vec<f64> = json["gbps_by_conn"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_f64().unwrap())
            .collect();
        assert_eq!(by_conn.len(), 4, "{json}");
        assert!(by_conn.iter().all(|&g| g > 0.0), "{json}");
        let (sum, gbps) = (by_conn.iter().sum::<f64>(), json["gbps"].as_f64().unwrap());
        assert!((sum - gbps).abs() <= 1e-9 * gbps.max(1.0), "{json}");
        let per_lcore = json["per_lcore"].as_array().unwrap();
        for (i, l) in per_lcore.iter().enumerate() {
            assert_eq!(l["conns"], 2, "{steering}, lcore {i}: {json}");
            // Acks and handshake for 2 x 6 MB come back to the owner.
            assert!(
                l["datagrams_in"].as_u64().unwrap() > 100,
                "{steering}, lcore {i}: {json}"
            );
            assert_eq!(l["unknown_connection"], 0, "{steering}, lcore {i}: {json}");
        }
        if steering == "software" {
            // Lcore 1 receives only what lcore 0, which owns the one rx
            // queue, hands it.
            let handed = per_lcore[0]["handed_over"].as_u64().unwrap();
            let received = per_lcore[1]["datagrams_in"].as_u64().unwrap();
            assert!(handed >= received, "{json}");
        }
    }
}

/// Jumbo frames where the port allows them: with --mtu 3000 on net_af_xdp
/// over a veth pair (af_xdp takes up to about 3.5 KB; the PMD sets the
/// kernel side's MTU too) the client's mbufs hold whole 3000-byte frames
/// and it sends 2972-byte datagrams, all counted by a kernel-socket server
/// in a netns; the other way, our server there receives a kernel client's
/// 2972-byte datagrams. An MTU over af_xdp's 4 KiB chunks and net_memif's
/// (which cannot change its MTU) are one-line errors naming the driver.
#[test]
fn dpdk_client_sends_jumbo_datagrams_when_the_port_takes_a_larger_mtu() {
    struct Veth;
    impl Drop for Veth {
        fn drop(&mut self) {
            sh("ip link del ainfpj-a 2>/dev/null; ip netns del ainfpj 2>/dev/null");
        }
    }
    sh("ip link del ainfpj-a 2>/dev/null; ip netns del ainfpj 2>/dev/null");
    let _veth = Veth;
    assert!(sh(
        "ip netns add ainfpj && ip link add ainfpj-a type veth peer name ainfpj-b \
         && ip link set ainfpj-b netns ainfpj && ip link set ainfpj-a up \
         && ip -n ainfpj addr add 10.92.0.1/24 dev ainfpj-b \
         && ip -n ainfpj link set ainfpj-b mtu 3000 up \
         && ip netns exec ainfpj ethtool -K ainfpj-b tx off >/dev/null"
    ));
    let port = 24_436;
    let _server = Server(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                "ainfpj",
                PERF,
                "quic-server",
                "--transport",
                "udp",
            ])
            .args(["--bind", &format!("10.92.0.1:{port}"), "--duration", "120"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the quic server in the netns"),
    );
    std::thread::sleep(Duration::from_millis(300));
    let out = Command::new(PERF)
        .args([
            "quic-client",
            "--connect-timeout",
            "30",
            "--transport",
            "dpdk",
            "--json",
            "--mtu",
            "3000",
        ])
        .args([
            "--vdev",
            "net_af_xdp_pj0,iface=ainfpj-a",
            "--ip",
            "10.92.0.2/24",
        ])
        .args([
            "--target",
            &format!("10.92.0.1:{port}"),
            "--bytes",
            "20000000",
        ])
        .args(["--", "--in-memory"])
        .output()
        .expect("run the dpdk quic client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "client failed: {stderr}");
    assert!(
        stderr.contains("port MTU 3000, UDP payloads up to 2972 B"),
        "{stderr}"
    );
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {stdout}"));
    assert_eq!(json["bytes"], 20_000_000, "{json}");
    assert_eq!(
        json["max_datagram"], 2972,
        "discovered: the path takes it: {json}"
    );

    // The other way: a kernel client in the netns sends 2972-byte datagrams
    // to our server on net_af_xdp. The kernel writes each frame after 256 B
    // of XDP headroom in an mbuf of our pool, so the mbufs must hold that too.
    let dpdk_port = 24_437;
    let _dpdk_server = Server(
        Command::new(PERF)
            .args(["quic-server", "--transport", "dpdk", "--mtu", "3000"])
            .args([
                "--vdev",
                "net_af_xdp_pj1,iface=ainfpj-a",
                "--ip",
                "10.92.0.2/24",
            ])
            .args(["--bind", &format!("10.92.0.2:{dpdk_port}")])
            .args(["--duration", "120", "--", "--in-memory"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the dpdk quic server"),
    );
    // Each try is bounded: a client whose datagrams all vanish would wait
    // for QUIC's idle timeout. Retries cover the server's start-up.
    let out = (0..3)
        .find_map(|_| {
            std::thread::sleep(Duration::from_secs(1));
            let out = Command::new("ip")
                .args(["netns", "exec", "ainfpj", "timeout", "30", PERF])
                .args([
                    "quic-client",
                    "--connect-timeout",
                    "30",
                    "--transport",
                    "udp",
                    "--json",
                ])
                .args(["--target", &format!("10.92.0.2:{dpdk_port}")])
                .args(["--bytes", "20000000"])
                .output()
                .expect("run the kernel quic client");
            out.status.success().then_some(out)
        })
        .expect("the kernel client never completed a 20 MB upload to our af_xdp server");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("UDP payloads up to 2972 B"), "{stderr}");
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {stdout}"));
    assert_eq!(json["bytes"], 20_000_000, "{json}");

    // More than fits a 4 KiB umem chunk: refused in one line, not EINVAL.
    let big = Command::new(PERF)
        .args(["quic-server", "--transport", "dpdk", "--mtu", "3500"])
        .args([
            "--vdev",
            "net_af_xdp_pj2,iface=ainfpj-a",
            "--ip",
            "10.92.0.2/24",
            "--bind",
            "10.92.0.2:4433",
            "--duration",
            "5",
            "--",
            "--in-memory",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&big.stderr);
    assert!(!big.status.success(), "{stderr}");
    assert!(
        stderr.contains("MTU 3500 is more than net_af_xdp receives into one 4 KiB umem chunk; the largest it takes here is 3438"),
        "{stderr}"
    );

    let sock = std::env::temp_dir().join(format!("ainfpj-{}.sock", std::process::id()));
    let memif = Command::new(PERF)
        .args(["quic-server", "--transport", "dpdk", "--mtu", "9000"])
        .args([
            "--vdev",
            &format!("net_memif_pj0,role=server,socket={}", sock.display()),
        ])
        .args([
            "--ip",
            "10.91.0.2/24",
            "--bind",
            "10.91.0.2:4433",
            "--duration",
            "5",
        ])
        .args(["--", "--in-memory"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&memif.stderr);
    assert!(!memif.status.success(), "{stderr}");
    assert!(
        stderr.contains("(net_memif) cannot set an MTU of 9000"),
        "{stderr}"
    );
}

/// Mutual TLS from the command line: `ainftp-dp certs` makes a cluster,
/// the server and a client load it with --certs and move data; a client
/// from another cluster is refused, and says it is about certificates.
#[test]
fn with_cluster_certificates_only_members_get_through() {
    let ours = tempfile::tempdir().unwrap();
    let theirs = tempfile::tempdir().unwrap();
    for dir in [&ours, &theirs] {
        common::make_cluster(dir.path(), &["server", "client"]);
    }
    let port = 24_439;
    let _server = Server::start_with(
        &format!("127.0.0.1:{port}"),
        &["--certs", ours.path().to_str().unwrap()],
    );
    let (bulk, _) = client(
        port,
        &[
            "--bytes",
            "1000000",
            "--certs",
            ours.path().to_str().unwrap(),
        ],
    );
    assert_eq!(bulk["bytes"], 1_000_000, "{bulk}");

    let out = Command::new(PERF)
        .args([
            "quic-client",
            "--transport",
            "udp",
            "--connect-timeout",
            "10",
        ])
        .args(["--target", &format!("127.0.0.1:{port}")])
        .args([
            "--bytes",
            "1000",
            "--certs",
            theirs.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a foreign cluster got through: {stderr}"
    );
    // The error line itself says where to look (a warning above it too).
    let error = stderr
        .lines()
        .find(|l| l.contains("closed early"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        error.contains("TLS alert") && error.contains("--certs"),
        "{error}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A DPDK server on net_tap over two lcores, software steering: 16 kernel
/// clients one after another, each from its own source port. The steering
/// lcore hands each connection to the lcore its 4-tuple hashes to, which
/// serves it whole (the client checks every byte) and sees it close; both
/// lcores get some (all 16 on one: a 1 in 32768 chance).
#[test]
fn dpdk_server_on_two_lcores_serves_each_connection_on_one_lcore() {
    const IFACE: &str = "ainfqs0";
    let server = Command::new(PERF)
        .args([
            "quic-server",
            "--transport",
            "dpdk",
            "--json",
            "--lcores",
            "0-1",
        ])
        .args(["--vdev", &format!("net_tap_qs0,iface={IFACE}")])
        .args(["--ip", "10.66.0.2/24", "--steering", "software"])
        .args(["--bind", "10.66.0.2:4433", "--duration", "120"])
        .args(["--", "--in-memory"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the dpdk quic server");
    let t0 = std::time::Instant::now();
    while !sh(&format!(
        "ip addr add 10.66.0.1/24 dev {IFACE} 2>/dev/null && ip link set {IFACE} up"
    )) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{IFACE} never appeared"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for i in 0..16 {
        let out = Command::new(PERF)
            .args(["quic-client", "--transport", "udp", "--json"])
            .args(["--connect-timeout", "30", "--target", "10.66.0.2:4433"])
            .args(["--bytes", "200000"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "client {i}: {stderr}");
    }
    std::thread::sleep(Duration::from_millis(300)); // the last close
    assert!(sh(&format!("kill -TERM {}", server.id())));
    let out = server.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {stdout}"));
    assert_eq!(json["connections_closed"], 16, "{json}");
    let per_lcore: Vec<u64> = json["per_lcore"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["connections_closed"].as_u64().unwrap())
        .collect();
    assert_eq!(per_lcore.len(), 2, "{json}");
    assert!(
        per_lcore.iter().all(|&n| n > 0),
        "both lcores serve: {json}"
    );
}
