//! Shared set-up for the stack's tests against real kernels: the EAL, the
//! runtime on its own thread, kernel-side interfaces and sockets. Each
//! test is its own process under nextest (EAL is once per process), and
//! each uses its own interface names and subnet so tests run in parallel.
//!
//! Subnets that tests put on kernel interfaces in the root namespace, in
//! this crate and in `tools/tests` (two interfaces on one subnet would
//! route one test's traffic into the other's device). Take a free one:
//!
//! | subnet | interface | test |
//! |---|---|---|
//! | 10.59.0 | ainftap59 | tap, back-off while answering pings |
//! | 10.62.0 | ainfrss62 | rss, steering back-off |
//! | 10.63.0 (and .10 - .29 on the kernel side) | ainftap63 | tap, many addresses resolving at once |
//! | 10.64.0, 10.65.0 | ainfho64, ainfho65 | quic_handoff |
//! | 10.66.0 | ainfqs0 | tools perf_quic, server on two lcores |
//! | 10.67.0 (VLAN 5, no kernel address) | ainftap67 | tap, VLAN |
//! | 10.68.0, 192.0.2.2/32 | ainftap68 | tap, no route |
//! | 10.69.0, 192.0.2.1/32 | ainftap69 | tap, gateway |
//! | 10.70.0 | ainfpq0 / ainfpq1 | tools perf_quic, two lcores |
//! | 10.71.0 | ainfdp71 | tools dp_cli, impaired port |
//! | 10.72.0 | ainfqc0 | quic_churn |
//! | 10.73.0 | ainfmtu0 | kernel_udp, route MTU |
//! | 10.74.0 - 10.76.0 | ainfq94 - ainfq96 | quic_interop, impaired links |
//! | 10.77.0 | ainfpm0 | quic_kernel_path |
//! | 10.78.0, 10.78.1 | ainfq91, ainfq92 | quic_interop |
//! | 10.79.0 | ainfq93 | quic_interop, lossy link |
//! | 10.80.0 - 10.84.0 | ainftap80 - 84 | tap |
//! | 10.85.0, 10.86.0 | ainfrss85, 86 | rss |
//! | 10.87.0 - 10.89.0 | ainfdp87 - 89 | tools dp_cli |
//! | 10.90.0 | ainfq99 | quic_interop, handshake corruption |
//! | 10.93.0 | arenastk0 | tools arena_stack |
//! | 10.94.0 | ainfq97 | quic_interop, resumption |
//! | 10.95.0 | ainfq98 | quic_interop, handshake loss |
//!
//! Namespaced peers (af_xdp, its jumbo test's 10.61.0, 10.92.0 in tools perf_quic, the collectives'
//! 10.98.k, quic_kernel_path's routed path 10.60.1 - 10.60.2) and memif
//! pairs (10.91.0) stay out of the root namespace's routing table.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dpdk_ffi::Eal;
use stack::counters::SharedCounters;
use stack::io::dpdk::{DpdkIo, UdpMbuf};
use stack::io::impair::Impaired;
use stack::quic::lcore::EndpointApp;
use stack::quic::perf::PerfServer;
use stack::quic::Endpoint;
use stack::runtime::{LcoreApp, RunReport, Runtime, RuntimeConfig, Services, ServicesApp};

/// The UDP payload our QUIC endpoints use over TAP links.
pub const MAX_PAYLOAD: usize = 1472;

pub fn eal(lcores: &str) -> Eal {
    Eal::init([
        "-l",
        lcores,
        "--no-pci",
        "--in-memory",
        "--log-level=*:warning",
    ])
    .expect("EAL init (root and hugepages: run scripts/setup-host.sh)")
}

pub fn sh(cmd: &str) {
    let st = Command::new("sh").arg("-c").arg(cmd).status().unwrap();
    assert!(st.success(), "`{cmd}` failed: {st}");
}

/// `make()` run on a thread that has entered network namespace `ns`:
/// what it creates there (a socket) stays in that namespace.
pub fn in_netns<T: Send>(ns: &str, make: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            make()
        })
        .join()
        .unwrap()
    })
}

pub fn sh_out(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A runtime running on its own thread until `finish`.
/// The runtime on its own thread, running `A` on every lcore (the UDP
/// services by default).
pub struct Running<A = ServicesApp<UdpMbuf>> {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<(RunReport, Vec<A>)>>,
    pub counters: Vec<Arc<SharedCounters>>,
    pub mac: [u8; 6],
    /// What the port turned on (offloads, queues, MTU).
    pub features: dpdk_ffi::PortFeatures,
}

impl Running {
    pub fn start<F>(eal: &Eal, cfg: &RuntimeConfig, services: F) -> Running
    where
        F: Fn(usize) -> Services<UdpMbuf> + Send + 'static,
    {
        Running::start_apps(eal, cfg, move |i| ServicesApp::new(services(i)))
    }
}

impl<A> Running<A>
where
    A: LcoreApp<DpdkIo> + LcoreApp<Impaired<DpdkIo>> + Send + 'static,
{
    pub fn start_apps<F>(eal: &Eal, cfg: &RuntimeConfig, make: F) -> Running<A>
    where
        F: Fn(usize) -> A + Send + 'static,
    {
        let rt = Runtime::start(eal, cfg).expect("runtime starts");
        let mac = rt.port().mac();
        let features = rt.port().features();
        let counters = rt.counters();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || rt.run_apps(s, make).expect("runtime runs"));
        Running {
            stop,
            handle: Some(handle),
            counters,
            mac,
            features,
        }
    }

    pub fn finish(self) -> RunReport {
        self.finish_apps().0
    }

    /// Stop, and get the report and every lcore's app back.
    pub fn finish_apps(mut self) -> (RunReport, Vec<A>) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().expect("runtime thread")
    }
}

impl<A> Drop for Running<A> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A cluster directory, removed when dropped: keep it while endpoints may
/// still load its files. Reads as its path.
pub struct ClusterDir {
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for ClusterDir {
    type Target = std::path::PathBuf;

    fn deref(&self) -> &std::path::PathBuf {
        &self.path
    }
}

/// A cluster directory with a CA and nodes `server` and `client`.
pub fn cluster(tag: &str) -> ClusterDir {
    let dir = tempfile::Builder::new()
        .prefix(&format!("ainftp-quic-{tag}-"))
        .tempdir()
        .unwrap();
    let path = dir.path().to_path_buf();
    stack::quic::certs::create_ca(&path, tag).unwrap();
    stack::quic::certs::issue_node(&path, "server").unwrap();
    stack::quic::certs::issue_node(&path, "client").unwrap();
    ClusterDir { path, _dir: dir }
}

/// A cluster node's QUIC config speaking the perf protocol.
pub fn perf_node_config(dir: &std::path::Path, name: &str) -> stack::quic::QuicConfig {
    stack::quic::QuicConfig {
        alpn: vec![stack::quic::perf::PERF_ALPN.to_vec()],
        ..stack::quic::QuicConfig::cluster_node(&stack::quic::certs::NodeFiles::in_dir(dir, name))
    }
}

/// Give the kernel side of a TAP device an address and bring it up.
pub fn tap_up(iface: &str, kernel_ip: Ipv4Addr, prefix: u8) {
    sh(&format!(
        "ip addr add {kernel_ip}/{prefix} dev {iface} && ip link set {iface} up"
    ));
}

/// Send `payload` to `to` and wait for its echo, byte-exact. Resends
/// every 500 ms (the first datagrams may wait for ARP), so a late echo of
/// an earlier send may arrive first: replies that differ are skipped, and
/// the test fails if the exact echo never comes.
pub fn echo_once(sock: &UdpSocket, to: SocketAddrV4, payload: &[u8]) {
    let mut buf = vec![0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut others = 0;
    while Instant::now() < deadline {
        sock.send_to(payload, to).unwrap();
        let resend_at = Instant::now() + Duration::from_millis(500);
        while Instant::now() < resend_at {
            match recv(sock, &mut buf) {
                Ok((n, from)) => {
                    assert_eq!(from, std::net::SocketAddr::V4(to), "reply from the echo");
                    if &buf[..n] == payload {
                        return;
                    }
                    others += 1;
                }
                Err(_) => break,
            }
        }
    }
    panic!(
        "no exact echo of {} bytes from {to} ({others} other replies)",
        payload.len()
    );
}

/// `recv_from`, retried when a signal interrupts it: net_tap asks for
/// SIGIO on its queues, and signals reach this process's socket calls too.
pub fn recv(sock: &UdpSocket, buf: &mut [u8]) -> std::io::Result<(usize, std::net::SocketAddr)> {
    loop {
        match sock.recv_from(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

pub fn udp_socket(bind: Ipv4Addr) -> UdpSocket {
    let s = UdpSocket::bind(SocketAddrV4::new(bind, 0)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    s
}

/// A payload of `n` bytes that differs per size and position.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub type PerfServerApp = EndpointApp<UdpMbuf, PerfServer>;

/// Our perf server on DPDK over a TAP device `iface` at `us`/24, with the
/// kernel's end at .1; the cluster certificates are in the returned dir.
/// `idle_timeout` overrides the config's.
pub fn start_perf_server(
    eal: &dpdk_ffi::Eal,
    iface: &str,
    us: Ipv4Addr,
    tag: &str,
    idle_timeout: Option<Duration>,
) -> (Running<PerfServerApp>, ClusterDir) {
    let cfg = RuntimeConfig::new(&format!("net_tap0,iface={iface}"), us, 24);
    start_perf_server_with(eal, cfg, iface, us, tag, idle_timeout)
}

/// [`start_perf_server`] with what the server sends impaired on the port.
pub fn start_impaired_perf_server(
    eal: &dpdk_ffi::Eal,
    iface: &str,
    us: Ipv4Addr,
    tag: &str,
    impair: stack::io::impair::ImpairConfig,
) -> (Running<PerfServerApp>, ClusterDir) {
    let mut cfg = RuntimeConfig::new(&format!("net_tap0,iface={iface}"), us, 24);
    cfg.impair = Some(impair);
    start_perf_server_with(eal, cfg, iface, us, tag, None)
}

fn start_perf_server_with(
    eal: &dpdk_ffi::Eal,
    cfg: RuntimeConfig,
    iface: &str,
    us: Ipv4Addr,
    tag: &str,
    idle_timeout: Option<Duration>,
) -> (Running<PerfServerApp>, ClusterDir) {
    let dir = cluster(tag);
    let server_dir = dir.clone();
    let running = Running::start_apps(eal, &cfg, move |i| {
        let mut config = perf_node_config(&server_dir, "server");
        config.idle_timeout = idle_timeout.unwrap_or(config.idle_timeout);
        let ep = Endpoint::server(config, i as u8, MAX_PAYLOAD).expect("server config");
        EndpointApp::new(ep, PerfServer::new())
    });
    let [a, b, c, _] = us.octets();
    tap_up(iface, Ipv4Addr::new(a, b, c, 1), 24);
    (running, dir)
}
