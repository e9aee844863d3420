//! ainftp-dp as a user runs it: on a TAP device it answers Linux's ping and
//! UDP, stops cleanly on SIGTERM or SIGINT with a summary (no mbuf left out), and bad
//! input gets one clear line and a non-zero exit.

mod common;

use std::net::UdpSocket;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const DP: &str = env!("CARGO_BIN_EXE_ainftp-dp");

fn sh(cmd: &str) -> Output {
    Command::new("sh").arg("-c").arg(cmd).output().unwrap()
}

fn assert_one_line_error(args: &[&str], needle: &str) {
    let out = Command::new(DP).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("ainftp-dp:"))
        .collect();
    assert_eq!(ours.len(), 1, "{args:?}: one error line expected: {stderr}");
    assert!(ours[0].contains(needle), "'{needle}' not in: {}", ours[0]);
}

/// Starts ainftp-dp on TAP device `iface` at 10.`net`.0.2/24 with a UDP
/// echo on port 7 and `extra` flags, waits for the device and gives the
/// kernel side 10.`net`.0.1/24.
fn start_on_tap(iface: &str, net: u8, extra: &[&str]) -> Child {
    let ip = format!("10.{net}.0.2/24");
    let child = Command::new(DP)
        .args([
            "--lcores",
            "0",
            "--ip",
            &ip,
            "--tap-iface",
            iface,
            "--udp-echo",
            "7",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The TAP interface appears once the port is up.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sh(&format!("ip link show {iface}")).status.success() {
        assert!(
            Instant::now() < deadline,
            "ainftp-dp did not bring up its TAP device"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let kernel = format!("ip addr add 10.{net}.0.1/24 dev {iface} && ip link set {iface} up");
    assert!(sh(&kernel).status.success(), "{kernel}");
    child
}

#[test]
fn arguments_that_are_not_utf8_are_refused_without_a_panic() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    // The first argument was read as UTF-8 (to spot `certs`), which
    // panicked with a backtrace on anything else.
    for arg in [&b"--config=/tmp/\xff.toml"[..], b"\xff"] {
        let out = Command::new(DP)
            .arg(OsStr::from_bytes(arg))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            stderr.contains("reading config") || stderr.contains("error: unexpected argument"),
            "{stderr}"
        );
    }
}

#[test]
fn bad_input_gets_one_clear_line() {
    assert_one_line_error(&["--lcores", "0"], "--ip is required");
    assert_one_line_error(
        &[
            "--lcores",
            "0",
            "--ip",
            "10.0.0.2/24",
            "--mbuf-arena",
            "--vdev",
            "net_af_xdp0,iface=lo",
        ],
        "net_af_xdp cannot receive into an external-memory (arena) pool",
    );
    assert_one_line_error(&["--lcores", "0", "--ip", "10.0.0.2"], "prefix");
    assert_one_line_error(
        &[
            "--lcores",
            "0",
            "--ip",
            "10.0.0.2/24",
            "--vdev",
            "net_bogus0",
        ],
        "net_bogus0",
    );
    assert_one_line_error(
        &[
            "--lcores",
            "0",
            "--ip",
            "10.0.0.2/24",
            "--gateway",
            "192.168.9.1",
            "--vdev",
            "net_null0",
        ],
        "outside",
    );
    assert_one_line_error(
        &[
            "--lcores",
            "0",
            "--ip",
            "10.0.0.2/24",
            "--config",
            "/nonexistent.toml",
        ],
        "nonexistent",
    );
}

#[test]
fn host_settings_and_names_are_checked_before_dpdk_starts() {
    // A device that does not exist: were DPDK started first, the error
    // would name it instead of the bad setting.
    let before_dpdk = |extra: &[&str], needle: &str| {
        let mut args = vec!["--lcores", "0", "--vdev", "net_bogus0"];
        args.extend(extra);
        if !extra.contains(&"--ip") {
            args.extend(["--ip", "10.0.0.2/24"]);
        }
        assert_one_line_error(&args, needle);
    };
    before_dpdk(&["--vlan", "0"], "VLAN id 0 is outside 1..4094");
    before_dpdk(&["--vlan", "4095"], "VLAN id 4095 is outside 1..4094");
    before_dpdk(&["--ip", "10.0.0.0/24"], "network address");
    before_dpdk(&["--ip", "0.0.0.0/0"], "cannot be a host address");
    before_dpdk(&["--mac", "ff:ff:ff:ff:ff:ff"], "not a unicast MAC");
    before_dpdk(&["--mtu", "10"], "--mtu 10 is below IPv4's minimum of 68");
    // The TAP device's name (no --vdev: ainftp-dp makes one).
    for (name, needle) in [
        ("", "an interface name is 1 to 15 bytes"),
        (
            "averyveryverylongname",
            "an interface name is 1 to 15 bytes",
        ),
        ("a/b", "'/' cannot be in an interface name"),
        ("tap,x=1", "',' cannot be in an interface name"),
    ] {
        assert_one_line_error(
            &["--lcores", "0", "--ip", "10.0.0.2/24", "--tap-iface", name],
            &format!("--tap-iface {name:?}: {needle}"),
        );
    }
    assert_one_line_error(
        &["--lcores", "0", "--ip", "10.0.0.2/24", "--vdev", ""],
        "--vdev is empty",
    );
    // A negative number is a bad value of its flag, not an unknown flag;
    // a PCI device number is 5 bits.
    for (flag, value) in [
        ("--vlan", "-1"),
        ("--arp-max-entries", "-5"),
        ("--pci", "3b:ff.0"),
    ] {
        let out = Command::new(DP)
            .args(["--lcores", "0", "--ip", "10.0.0.2/24", flag, value])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            stderr.contains(&format!("invalid value '{value}' for '{flag}")),
            "{stderr}"
        );
    }
    // certs: a --dir that is a file.
    let file = tempfile::NamedTempFile::new().unwrap();
    let path = file.path().to_str().unwrap();
    let out = Command::new(DP)
        .args(["certs", "--dir", path, "--ca"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(
        stderr.trim(),
        format!("ainftp-dp certs: --dir {path} exists and is not a directory")
    );
}

#[test]
fn answers_ping_and_udp_on_a_tap_device_and_stops_cleanly_on_sigterm() {
    // It also pings the kernel side, 10.88.0.1 (up once start_on_tap returns).
    let child = start_on_tap(
        "ainfdp88",
        88,
        &[
            "--stats-period",
            "0.5",
            "--json",
            "--ping",
            "10.88.0.1",
            "--ping-interval",
            "0.1",
        ],
    );
    let ping = sh("ping -c 3 -i 0.2 -W 2 10.88.0.2");
    let ping_text = String::from_utf8_lossy(&ping.stdout);
    assert!(ping_text.contains("3 received"), "{ping_text}");

    let sock = UdpSocket::bind("10.88.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    sock.send_to(b"echo me", "10.88.0.2:7").unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = sock.recv_from(&mut buf).unwrap();
    assert_eq!(
        (&buf[..n], from.to_string().as_str()),
        (&b"echo me"[..], "10.88.0.2:7")
    );

    std::thread::sleep(Duration::from_millis(700)); // one stats line at least
    assert!(sh(&format!("kill -TERM {}", child.id())).status.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit after SIGTERM: {stderr}");
    assert!(stderr.contains("rx-pps"), "periodic stats: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(json["mbufs_in_use_after_close"], 0, "{json}");
    // Our pings to the kernel: about 13 in 1.3 s; the first may go out
    // before the kernel side has its address.
    let ping = &json["ping"];
    assert_eq!(ping["target"], "10.88.0.1", "{json}");
    assert!(ping["received"].as_u64().unwrap() >= 5, "{json}");
    assert_eq!(ping["unmatched"], 0, "{json}");
    // Requests sent before the kernel side was up waited for ARP, and
    // were answered then: none lost.
    assert_eq!(ping["lost"], 0, "{json}");
    let rtt = |k: &str| ping[k].as_f64().unwrap();
    assert!(
        0.0 < rtt("rtt_min_us")
            && rtt("rtt_min_us") <= rtt("rtt_avg_us")
            && rtt("rtt_avg_us") <= rtt("rtt_max_us"),
        "{json}"
    );
    // Percentiles from a histogram of every round trip (3 significant
    // digits, so within 0.1% of the exact extremes).
    assert!(
        rtt("rtt_min_us") * 0.999 <= rtt("rtt_p50_us")
            && rtt("rtt_p50_us") <= rtt("rtt_p99_us")
            && rtt("rtt_p99_us") <= rtt("rtt_p999_us")
            && rtt("rtt_p999_us") <= rtt("rtt_max_us") * 1.001,
        "{json}"
    );
    assert!(
        stderr.contains("64 bytes from 10.88.0.1: icmp_seq=") && stderr.contains("received"),
        "{stderr}"
    );
    assert!(
        json["lcores"][0]["icmp_echo_replies"].as_u64().unwrap() >= 3,
        "{json}"
    );
    assert!(
        json["lcores"][0]["udp_out"].as_u64().unwrap() >= 1,
        "{json}"
    );
}

#[test]
fn certs_makes_a_cluster_ca_and_node_certificates() {
    let dir = std::env::temp_dir().join(format!("ainftp-dp-certs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let out = Command::new(DP)
        .args([
            "certs", "--dir", d, "--ca", "--node", "node0", "--node", "node1",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "ca.pem",
        "ca.key",
        "node0.pem",
        "node0.key",
        "node1.pem",
        "node1.key",
    ] {
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        assert!(text.starts_with("-----BEGIN"), "{f}");
    }
    // One more node later, from the same CA.
    let out = Command::new(DP)
        .args(["certs", "--dir", d, "--node", "node2"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(dir.join("node2.pem").exists());
    // A second CA would orphan every node: refused.
    let out = Command::new(DP)
        .args(["certs", "--dir", d, "--ca"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("already has a CA"),
        "{stderr}"
    );
    // A node's directory has ca.pem but not ca.key: --ca there is refused
    // too, and the cluster's ca.pem stays.
    let node_dir = dir.join("node-only");
    std::fs::create_dir(&node_dir).unwrap();
    let ca_pem = std::fs::read(dir.join("ca.pem")).unwrap();
    std::fs::write(node_dir.join("ca.pem"), &ca_pem).unwrap();
    let out = Command::new(DP)
        .args([
            "certs",
            "--dir",
            node_dir.to_str().unwrap(),
            "--ca",
            "--node",
            "n9",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("already has a CA (ca.pem)"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(node_dir.join("ca.pem")).unwrap(), ca_pem);
    assert!(!node_dir.join("n9.key").exists());
    // Nodes without a CA, and bad names, get one clear line.
    let empty = dir.join("empty");
    let out = Command::new(DP)
        .args(["certs", "--dir", empty.to_str().unwrap(), "--node", "n"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--ca"), "{stderr}");
    let out = Command::new(DP)
        .args(["certs", "--dir", d, "--node", "../evil"])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not usable"));
    // A refused run writes nothing: no CA appears beside a bad node name.
    let fresh = dir.join("fresh");
    let out = Command::new(DP)
        .args([
            "certs",
            "--dir",
            fresh.to_str().unwrap(),
            "--ca",
            "--node",
            "a b",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not usable"));
    assert!(!fresh.join("ca.key").exists() && !fresh.join("ca.pem").exists());
    // Nor when a node would be named like the CA's files, or twice.
    for nodes in [
        ["--node", "ca", "--node", "x"],
        ["--node", "n", "--node", "n"],
    ] {
        let out = Command::new(DP)
            .args(["certs", "--dir", fresh.to_str().unwrap(), "--ca"])
            .args(nodes)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{nodes:?}");
        assert!(!fresh.join("ca.key").exists(), "{nodes:?} wrote a CA");
    }
    // A node's key is never silently replaced.
    let before = std::fs::read_to_string(dir.join("node2.key")).unwrap();
    let out = Command::new(DP)
        .args(["certs", "--dir", d, "--node", "node2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("node node2 already has a certificate or key"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("node2.key")).unwrap(),
        before
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mbuf_arena_on_a_tap_device_echoes_every_size_and_returns_every_mbuf() {
    let child = start_on_tap(
        "ainfdp89",
        89,
        &["--mbuf-arena", "--stats-period", "0", "--json"],
    );
    let sock = UdpSocket::bind("10.89.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 2048];
    for len in [1usize, 17, 512, 1000, 1472] {
        let sent: Vec<u8> = (0..len).map(|i| (i * 31 + len) as u8).collect();
        sock.send_to(&sent, "10.89.0.2:7").unwrap();
        let (n, _) = sock.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], &sent[..], "echo of {len} bytes");
    }
    // SIGINT (Ctrl-C) here; the other tests stop the appliance with SIGTERM.
    assert!(sh(&format!("kill -INT {}", child.id())).status.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit after SIGINT: {stderr}");
    assert!(
        stderr.contains("mbufs in an arena at") && stderr.contains("registered with DPDK"),
        "says where the buffers are: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(json["mbufs_in_use_after_close"], 0, "{json}");
    assert!(
        json["lcores"][0]["udp_out"].as_u64().unwrap() >= 5,
        "{json}"
    );
}

/// How a test frame is made invalid.
type Spoil = dyn Fn(&mut Vec<u8>);

/// An Ethernet frame from the kernel side (10.`net`.0.1, port 5000) to
/// ainftp-dp's echo at 10.`net`.0.2:7, with valid checksums; `edit`
/// spoils it after the checksums are set.
fn frame_to_echo(net: u8, dst_mac: [u8; 6], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    use stack::wire::checksum;
    use std::net::Ipv4Addr;
    let (src, dst) = (Ipv4Addr::new(10, net, 0, 1), Ipv4Addr::new(10, net, 0, 2));
    let payload = b"ping";
    let udp_len = 8 + payload.len() as u16;
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x00]);
    let ip = [
        &[0x45, 0][..],
        &(20 + udp_len).to_be_bytes(),
        &[0, 1, 0x40, 0, 64, 17, 0, 0],
        &src.octets(),
        &dst.octets(),
    ]
    .concat();
    f.extend_from_slice(&ip);
    let ip_sum = checksum::finish(checksum::data(&f[14..34]));
    f[24..26].copy_from_slice(&ip_sum.to_be_bytes());
    f.extend_from_slice(&[0x13, 0x88, 0, 7]);
    f.extend_from_slice(&udp_len.to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    let pseudo = checksum::pseudo_header_v4(src, dst, 17, udp_len);
    let udp_sum = checksum::finish(checksum::combine(&[pseudo, checksum::data(&f[34..])]));
    f[40..42].copy_from_slice(&udp_sum.to_be_bytes());
    edit(&mut f);
    f
}

/// Frames that must not reach the echo, sent by the kernel side of the
/// TAP device through a packet socket: each is dropped and counted under
/// its reason in the summary, the valid ones are answered, and no mbuf
/// is left out.
#[test]
fn bad_frames_from_the_wire_are_dropped_and_counted_by_reason() {
    const NET: u8 = 87;
    const IFACE: &str = "ainfdp87";
    let ours = [2, 0, 0, 0, 0, 0x87];
    let child = start_on_tap(IFACE, NET, &["--mac", "02:00:00:00:00:87", "--json"]);
    sh(&format!(
        "echo 1 > /proc/sys/net/ipv6/conf/{IFACE}/disable_ipv6"
    ));
    let iface = pnet_datalink::interfaces()
        .into_iter()
        .find(|i| i.name == IFACE)
        .expect("the TAP interface");
    let pnet_datalink::Channel::Ethernet(mut tx, _rx) =
        pnet_datalink::channel(&iface, pnet_datalink::Config::default()).unwrap()
    else {
        panic!("not an Ethernet channel")
    };
    // Sets IP header byte `at` and keeps the header checksum valid, so
    // that only the field itself is wrong.
    let ip_field = |at: usize, value: u8| {
        move |f: &mut Vec<u8>| {
            f[at] = value;
            f[24..26].copy_from_slice(&[0, 0]);
            let s = stack::wire::checksum::finish(stack::wire::checksum::data(&f[14..34]));
            f[24..26].copy_from_slice(&s.to_be_bytes());
        }
    };
    let spoiled: [(&str, Box<Spoil>); 5] = [
        ("bad_checksum", Box::new(|f: &mut Vec<u8>| f[45] ^= 0x10)), // a payload bit
        ("fragmented", Box::new(ip_field(20, 0x20))),                // more fragments
        ("foreign_mac", Box::new(|f: &mut Vec<u8>| f[5] = 0x99)),
        ("malformed", Box::new(ip_field(14, 0x65))), // IP version 6
        ("truncated", Box::new(|f: &mut Vec<u8>| f.truncate(40))), // inside UDP
    ];
    const EACH: u64 = 5;
    for _ in 0..EACH {
        for (_, spoil) in &spoiled {
            let f = frame_to_echo(NET, ours, spoil);
            tx.send_to(&f, None).unwrap().unwrap();
        }
        let valid = frame_to_echo(NET, ours, |_| {});
        tx.send_to(&valid, None).unwrap().unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(sh(&format!("kill -TERM {}", child.id())).status.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit after SIGTERM: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let lcore = &json["lcores"][0];
    for (reason, _) in &spoiled {
        let n = lcore["drops"][reason].as_u64().unwrap_or(0);
        // The kernel's own frames (multicast) may add foreign-MAC drops.
        let ok = if *reason == "foreign_mac" {
            n >= EACH
        } else {
            n == EACH
        };
        assert!(ok, "{reason}: {n} drops counted, {EACH} sent: {json}");
    }
    assert_eq!(
        lcore["udp_out"], EACH,
        "the valid frames are echoed: {json}"
    );
    assert_eq!(json["mbufs_in_use_after_close"], 0, "{json}");
}

/// `--impair` on a real port: what ainftp-dp sends over its TAP device is
/// dropped, duplicated and corrupted as asked, the kernel side sees each
/// of the three, and the summary says how many of each.
#[test]
fn an_impaired_port_drops_duplicates_and_corrupts_what_it_sends_and_says_how_much() {
    const N: usize = 300;
    let iface = "ainfdp71";
    let child = start_on_tap(
        iface,
        71,
        &[
            "--mac",
            "02:00:00:00:00:71",
            "--neighbour",
            "10.71.0.1=02:00:00:00:01:71",
            "--impair",
            "loss=0.2,dup=0.2,corrupt=0.2,seed=7",
            "--stats-period",
            "0",
            "--json",
        ],
    );
    // Static neighbours both ways: ARP would be impaired too.
    let neigh = format!(
        "ip link set dev {iface} address 02:00:00:00:01:71 && \
         ip neigh replace 10.71.0.2 lladdr 02:00:00:00:00:71 dev {iface}"
    );
    assert!(sh(&neigh).status.success(), "{neigh}");
    // Room for every reply, even if the reader below is slow to run.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
    sock.set_recv_buffer_size(4 << 20).unwrap();
    sock.bind(
        &"10.71.0.1:0"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    let sock = UdpSocket::from(sock);
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let datagram =
        |seq: usize| -> Vec<u8> { (0..64).map(|i| (seq * 7 + i) as u8 ^ 0x5a).collect() };
    // Replies are read while we send, so none overflows the socket buffer.
    let reader = {
        let sock = sock.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = [0u8; 2048];
            while let Ok((n, _)) = sock.recv_from(&mut buf) {
                got.push(buf[..n].to_vec());
            }
            got
        })
    };
    for seq in 0..N {
        sock.send_to(&datagram(seq), "10.71.0.2:7").unwrap();
    }
    let sent: std::collections::HashMap<Vec<u8>, usize> =
        (0..N).map(|s| (datagram(s), s)).collect();
    let mut seen = vec![0u32; N];
    let mut foreign = 0;
    for d in reader.join().unwrap() {
        match sent.get(&d) {
            Some(&seq) => seen[seq] += 1,
            None => foreign += 1,
        }
    }
    assert!(sh(&format!("kill -TERM {}", child.id())).status.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit after SIGTERM: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let lcore = &json["lcores"][0];
    let count = |k: &str| lcore["impaired"][k].as_u64().unwrap_or(0);
    let (dropped, duplicated, corrupted) =
        (count("dropped"), count("duplicated"), count("corrupted"));

    let missing = seen.iter().filter(|&&c| c == 0).count();
    let twice = seen.iter().filter(|&&c| c >= 2).count();
    assert_eq!(
        lcore["udp_in"].as_u64(),
        Some(N as u64),
        "every datagram arrived: {json}"
    );
    assert!(
        missing > 0 && dropped > 0,
        "loss: {missing} never came back; {json}"
    );
    assert!(
        twice > 0 && duplicated > 0,
        "duplication: {twice} came back twice; {json}"
    );
    assert!(
        foreign > 0 && corrupted > 0,
        "corruption: {foreign} came back altered; {json}"
    );
    // Each echo left as one copy, or two, or none (`udp_out` counts what
    // left the port): the kernel got exactly that, and it adds up to the
    // impairment's counts, give or take the announcement at port up,
    // which went through the impairment too.
    let got = seen.iter().map(|&c| c as u64).sum::<u64>() + foreign;
    assert_eq!(lcore["udp_out"].as_u64(), Some(got), "{json}");
    let expected = N as u64 + duplicated - dropped;
    assert!(
        got.abs_diff(expected) <= 1,
        "the kernel got {got} datagrams, the counts say {expected}: {json}"
    );
    assert!(stderr.contains("impaired: dropped"), "{stderr}");
    assert_eq!(json["mbufs_in_use_after_close"], 0, "{json}");
}

#[test]
fn a_tap_device_that_already_exists_is_refused_not_shared() {
    // Another appliance's TAP device: joining it as more queues would let
    // the kernel spread traffic over two unrelated hosts.
    let iface = "ainfdp77";
    let _ = sh(&format!("ip link del {iface}"));
    assert!(sh(&format!("ip tuntap add dev {iface} mode tap"))
        .status
        .success());
    let refused = std::panic::catch_unwind(|| {
        assert_one_line_error(
            &[
                "--ip",
                "10.77.0.2/24",
                "--lcores",
                "0",
                "--tap-iface",
                iface,
                "--duration",
                "1",
            ],
            &format!("{iface} already exists"),
        )
    });
    let _ = sh(&format!("ip link del {iface}"));
    refused.unwrap();
}

#[test]
fn a_closed_stderr_does_not_abort_the_appliance() {
    // `ainftp-dp 2>&1 | head`: its stats lines go to stderr.
    let iface = "ainfdp78";
    let mut cmd = Command::new(DP);
    cmd.args([
        "--lcores",
        "0",
        "--ip",
        "10.78.0.2/24",
        "--tap-iface",
        iface,
    ])
    .args(["--duration", "2", "--stats-period", "0.1"]);
    let status = common::exit_with_closed_pipes(cmd);
    assert!(status.success(), "{status:?}");
    assert!(
        !sh(&format!("ip link show {iface}")).status.success(),
        "TAP left behind"
    );
}

/// A PMD without RSS (net_ring) on two lcores: ainftp-dp falls back to
/// software steering and says so, once, in its log and its banner.
#[test]
fn without_rss_the_appliance_steers_in_software_and_says_so() {
    let out = Command::new(DP)
        .args([
            "--vdev",
            "net_ring_dp0",
            "--ip",
            "10.64.0.2/24",
            "--lcores",
            "0-1",
        ])
        .args(["--duration", "0.3", "--stats-period", "0"])
        .env_remove("RUST_LOG") // the default log level, as a user has it
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr
            .matches("steers flows to the others in software")
            .count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("steering software"), "{stderr}");
    assert!(!stderr.contains("will not be spread"), "{stderr}");
}
