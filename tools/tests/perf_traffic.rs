//! Packets really leave ainftp-perf: txonly frames on a net_tap device are
//! read back on the kernel side byte for byte; txonly and rxonly in two
//! processes meet over net_memif.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pnet_datalink::{Channel, Config, NetworkInterface};
use stack::wire::checksum;

const PERF: &str = env!("CARGO_BIN_EXE_ainftp-perf");

fn wait_for_interface(name: &str, limit: Duration) -> NetworkInterface {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(i) = pnet_datalink::interfaces()
            .into_iter()
            .find(|i| i.name == name && i.is_up())
        {
            return i;
        }
        assert!(
            Instant::now() < deadline,
            "interface {name} did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn txonly_frames_on_net_tap_arrive_at_the_kernel_byte_exact() {
    const IFACE: &str = "aptx0";
    const SIZE: usize = 200;
    let child = Command::new(PERF)
        .args([
            "txonly",
            "--vdev",
            &format!("net_tap_tx0,iface={IFACE}"),
            "--lcores",
            "0-1",
        ])
        .args([
            "--pkt-size",
            &SIZE.to_string(),
            "--duration",
            "4",
            "--stats-period",
            "0",
            "--json",
        ])
        .args(["--eth-peer", "02:00:00:00:00:99"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let iface = wait_for_interface(IFACE, Duration::from_secs(10));
    let cfg = Config {
        read_timeout: Some(Duration::from_millis(100)),
        ..Config::default()
    };
    let Channel::Ethernet(_, mut rx) = pnet_datalink::channel(&iface, cfg).unwrap() else {
        panic!("not an Ethernet channel")
    };
    let mut checked = 0;
    let deadline = Instant::now() + Duration::from_secs(3);
    while checked < 100 && Instant::now() < deadline {
        let Ok(f) = rx.next() else { continue };
        if f.len() < 42 || f[12..14] != [0x08, 0x00] || f[26..30] != [198, 18, 0, 1] {
            continue; // the kernel's own traffic
        }
        assert_eq!(f.len(), SIZE, "frame length");
        assert_eq!(
            &f[0..6],
            &[2, 0, 0, 0, 0, 0x99],
            "destination MAC from --eth-peer"
        );
        assert_eq!(f[14], 0x45);
        assert_eq!(
            u16::from_be_bytes([f[16], f[17]]) as usize,
            SIZE - 14,
            "IP total length"
        );
        assert_eq!(
            checksum::finish(checksum::data(&f[14..34])),
            0,
            "IP header checksum"
        );
        assert_eq!(f[23], 17, "UDP");
        assert_eq!(&f[30..34], &[198, 18, 0, 2]);
        assert_eq!(u16::from_be_bytes([f[36], f[37]]), 9, "UDP dst port");
        assert_eq!(
            u16::from_be_bytes([f[38], f[39]]) as usize,
            SIZE - 34,
            "UDP length"
        );
        for (i, b) in f[42..].iter().enumerate() {
            assert_eq!(*b, i as u8, "payload byte {i}");
        }
        checked += 1;
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(checked, 100, "frames seen on the kernel side");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let j: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert!(j["ports"][0]["tx_pps"].as_f64().unwrap() > 1000.0, "{j}");
}

#[test]
fn txonly_and_rxonly_meet_over_net_memif_between_two_processes() {
    let sock = format!("/tmp/ainftp-test-memif-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&sock);
    // The server sends; the client (whose port statistics count its rx)
    // receives and reports. File prefixes keep the two EALs apart.
    let mut server = Command::new(PERF)
        .args([
            "txonly",
            "--vdev",
            &format!("net_memif_t0,role=server,socket={sock}"),
        ])
        .args(["--lcores", "0-1", "--duration", "8", "--stats-period", "0"])
        .args(["--", "--file-prefix", "ainftp-test-ms", "--huge-unlink"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let client = Command::new(PERF)
        .args([
            "rxonly",
            "--vdev",
            &format!("net_memif_t0,role=client,socket={sock}"),
        ])
        .args([
            "--lcores",
            "0-1",
            "--duration",
            "2",
            "--stats-period",
            "0",
            "--json",
        ])
        .args([
            "--",
            "--file-prefix",
            "ainftp-test-mc",
            "--huge-unlink",
            "--main-lcore",
            "1",
        ])
        .output()
        .unwrap();
    // DPDK 22.11's memif can crash the peer that is still sending when the
    // other side disconnects (testpmd does the same), so the server is only
    // stopped here, and the assertions are on the receiving process.
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_file(&sock);
    assert!(
        client.status.success(),
        "{}",
        String::from_utf8_lossy(&client.stderr)
    );
    let stdout = String::from_utf8_lossy(&client.stdout);
    let j: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let rx = j["ports"][0]["rx_pps"].as_f64().unwrap();
    let bps = j["ports"][0]["rx_bps"].as_f64().unwrap();
    assert!(rx > 10_000.0, "memif client received too little: {j}");
    // 64-byte frames: 512 bits each.
    assert!((bps / rx - 512.0).abs() < 1.0, "bytes per packet: {j}");
}
