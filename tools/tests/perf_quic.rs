//! ainftp-perf's QUIC modes end to end over kernel UDP on loopback: a
//! bulk transfer and a request/response run against the perf server. The
//! UDP payload follows the route (loopback's 64 KiB MTU, capped at 32 KiB)
//! unless --max-payload says otherwise.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const PERF: &str = env!("CARGO_BIN_EXE_ainftp-perf");

struct Server(Child);

impl Server {
    fn start(port: u16) -> Server {
        let child = Command::new(PERF)
            .args(["quic-server", "--transport", "udp", "--duration", "120"])
            .args(["--bind", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the quic server");
        // The client retries its Initial, but give the bind a moment.
        std::thread::sleep(Duration::from_millis(300));
        Server(child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn client(port: u16, args: &[&str]) -> (serde_json::Value, String) {
    let out: Output = Command::new(PERF)
        .args(["quic-client", "--transport", "udp", "--json"])
        .args(["--target", &format!("127.0.0.1:{port}")])
        .args(args)
        .output()
        .expect("run the quic client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "client failed: {stderr}");
    let last = stdout.lines().last().unwrap_or_default();
    let json = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {stdout}"));
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
    assert!(
        stderr.contains("UDP payloads up to 1200 B"),
        "--max-payload is taken as given: {stderr}"
    );
}
