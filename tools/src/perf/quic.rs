//! QUIC modes of ainftp-perf: a perf-protocol server and a client for bulk
//! goodput (`--test bulk`: every stream uploads `--bytes`, the server
//! counts) and request/response latency (`--test rr`: `--size`-byte echo
//! requests, one stream each, one at a time), over the stack's kernel UDP
//! backend (`--transport udp`) or our DPDK stack (`--transport dpdk`).
//! The protocol (ALPN ainftp-perf/1) is stack::quic::perf's.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::json;
use stack::counters::SharedCounters;
use stack::io::kernel::{
    route_payload, KernelUdp, KernelUdpConfig, MAX_UDP_PAYLOAD_V4, ROUTE_PAYLOAD_CAP,
};
use stack::io::{Datagram, PacketIo};
use stack::quic::certs::{create_ca, issue_node, NodeFiles};
use stack::quic::lcore::{EndpointApp, QuicService};
use stack::quic::perf::{ClientStream, PerfServer, MODE_DISCARD, MODE_ECHO, PERF_ALPN};
use stack::quic::{ConnHandle, ConnStats, Endpoint, EndpointStats, Event, QuicConfig, Trust};
use stack::rss::FlowPlacement;
use stack::runtime::{self, Runtime, RuntimeConfig};
use tempfile::TempDir;

use crate::arena_pool::ArenaPool;

use super::args::{PerfArgs, QuicTest, Transport};
use super::udp::{addr, stop_flag};
use crate::eal_setup::{self, EalOptions};
use crate::error::{Error, Result};

/// The endpoint's config: the cluster's certificates from `--certs DIR`
/// (nodes `server` and `client`, mutual TLS), or without it a throwaway
/// server certificate and no peer verification (benchmarks only). The
/// throwaway files live in the returned directory, removed when it is
/// dropped: keep it until every endpoint has loaded them.
fn quic_config(args: &PerfArgs, node: &str) -> Result<(QuicConfig, Option<TempDir>)> {
    let (mut cfg, dir) = match &args.certs {
        Some(dir) => (
            QuicConfig::cluster_node(&NodeFiles::in_dir(dir, node)),
            None,
        ),
        None => {
            let dir = tempfile::Builder::new()
                .prefix("ainftp-perf-certs-")
                .tempdir()
                .map_err(|e| {
                    Error::Io("creating a directory for throwaway certificates".into(), e)
                })?;
            let cert =
                |e: stack::quic::certs::CertError| Error::Usage(format!("certificates: {e}"));
            create_ca(dir.path(), "perf").map_err(cert)?;
            let files = issue_node(dir.path(), node).map_err(cert)?;
            let cfg = QuicConfig {
                cert_chain: Some(files.cert),
                private_key: Some(files.key),
                trust: Trust::InsecureNoVerify,
                ..QuicConfig::default()
            };
            (cfg, Some(dir))
        }
    };
    cfg.alpn = vec![PERF_ALPN.to_vec()];
    // One client host may open all of `--conns` at once.
    cfg.max_handshakes_per_ip = cfg.max_handshakes;
    cfg.congestion_control = args.cc.clone();
    cfg.pacing = args.pacing;
    crate::eline!(
        "ainftp-perf: QUIC congestion control {}, pacing {}",
        cfg.congestion_control,
        if cfg.pacing { "on" } else { "off" }
    );
    // Without --max-payload the device (port MTU, or the route) decides.
    cfg.max_udp_payload = args.max_payload.map_or(MAX_UDP_PAYLOAD_V4, |p| p as usize);
    Ok((cfg, dir))
}

fn quic_err(e: stack::quic::QuicError) -> Error {
    Error::Usage(e.to_string())
}

/// Our DPDK stack on `--lcores` (default: one) with `--steering`:
/// `--vdev`/`--pci` and `--ip A/N`; its packet buffers in an arena with `--mbuf-arena` (keep the ArenaPool as
/// long as the runtime).
pub(crate) fn dpdk_runtime(args: &PerfArgs) -> Result<(dpdk_ffi::Eal, Runtime, Option<ArenaPool>)> {
    let port = dpdk_ports(args, 1)?.remove(0);
    let eal = dpdk_eal(args, &dpdk_lcores(args)?)?;
    let (rt, arena) = port_runtime(&eal, args, &port)?;
    Ok((eal, rt, arena))
}

/// One DPDK port of ours: the device, our address on it, and the router
/// beyond its subnet.
pub(crate) struct PortSpec {
    pub device: String,
    pub ip: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Option<Ipv4Addr>,
}

/// The `want` ports of `--pci` then `--vdev`, each with its `--ip`, in
/// the order given.
pub(crate) fn dpdk_ports(args: &PerfArgs, want: usize) -> Result<Vec<PortSpec>> {
    let devices: Vec<&String> = args.pci.iter().chain(&args.vdev).collect();
    if devices.len() != want {
        return Err(Error::Usage(match want {
            1 => "--transport dpdk needs one port: --vdev SPEC (e.g. net_af_xdp0,iface=veth1) or --pci BDF".into(),
            n => format!(
                "--lanes {n} on --transport dpdk needs {n} ports, one per lane (--pci/--vdev), not {}",
                devices.len()
            ),
        }));
    }
    if args.ip.len() != want {
        return Err(Error::Usage(format!(
            "--transport dpdk needs one --ip ADDR/PREFIX per port: {want} port(s), {} --ip",
            args.ip.len()
        )));
    }
    let gateways = args
        .gateway
        .iter()
        .map(|g| {
            g.parse::<Ipv4Addr>()
                .map_err(|_| Error::Usage(format!("--gateway {g} is not an IPv4 address")))
        })
        .collect::<Result<Vec<_>>>()?;
    let gateway_of = |k: usize| match gateways.len() {
        0 => Ok(None),
        1 => Ok(Some(gateways[0])),
        n if n == want => Ok(Some(gateways[k])),
        n => Err(Error::Usage(format!(
            "--gateway: give one for every port or one per --ip ({want}), not {n}"
        ))),
    };
    devices
        .into_iter()
        .zip(&args.ip)
        .enumerate()
        .map(|(k, (device, ip))| {
            let (ip, prefix) = crate::dp::config::parse_cidr(ip)?;
            let mut rt = RuntimeConfig::new(device, ip, prefix);
            rt.gateway = gateway_of(k)?;
            // Before DPDK starts, so a bad address is named first.
            crate::dp::config::check_host(&rt)?;
            Ok(PortSpec {
                device: device.clone(),
                ip,
                prefix,
                gateway: rt.gateway,
            })
        })
        .collect()
}

/// `--lcores`, or the first online CPU: one side of a comparison gets one
/// core unless told otherwise.
pub(crate) fn dpdk_lcores(args: &PerfArgs) -> Result<Vec<u32>> {
    match &args.lcores {
        Some(list) => crate::cpulist::parse_lcores_flag(list),
        None => Ok(vec![eal_setup::default_lcores()?[0]]),
    }
}

/// DPDK's EAL on `lcores` (the first is the main thread's).
pub(crate) fn dpdk_eal(args: &PerfArgs, lcores: &[u32]) -> Result<dpdk_ffi::Eal> {
    eal_setup::init(&EalOptions {
        lcores,
        pci: &args.pci,
        extra: &args.eal_args,
    })
}

/// The stack on `port`, one worker per EAL lcore, with the flags' idle
/// policy, steering and MTU (and its buffers in an arena with
/// `--mbuf-arena`).
pub(crate) fn port_runtime(
    eal: &dpdk_ffi::Eal,
    args: &PerfArgs,
    port: &PortSpec,
) -> Result<(Runtime, Option<ArenaPool>)> {
    let mut cfg = RuntimeConfig::new(&port.device, port.ip, port.prefix);
    cfg.gateway = port.gateway;
    cfg.idle = args.idle.into();
    cfg.steering = args.steering;
    cfg.mtu = args.mtu;
    // Every lcore runs a QUIC endpoint: a packet goes to the lcore its
    // connection ID names, whichever queue it came in on.
    cfg.payload_owner = Some(stack::quic::cid::owner_of_datagram);
    let arena = match args.mbuf_arena {
        true => Some(ArenaPool::new(
            eal,
            cfg.mbufs,
            stack::runtime::data_room(&cfg.device, cfg.mtu)?,
        )?),
        false => None,
    };
    cfg.pool = arena.as_ref().map(|a| a.pool().clone());
    let rt = Runtime::start(eal, &cfg)?;
    if let Some(a) = &arena {
        crate::eprint_line(&format!("ainftp-perf: {}", a.describe()));
    }
    Ok((rt, arena))
}

fn new_endpoint<B: Datagram>(
    server: bool,
    cfg: &QuicConfig,
    lcore: u8,
    max_payload: usize,
) -> std::result::Result<Endpoint<B>, stack::quic::QuicError> {
    if server {
        Endpoint::server(cfg.clone(), lcore, max_payload)
    } else {
        Endpoint::client(cfg.clone(), lcore, max_payload)
    }
}

/// What an lcore's service is told when it is made.
struct LcoreSlot {
    index: usize,
    lcores: usize,
    /// Our address (the kernel socket's, or the stack's IP with the
    /// `--bind` port or 40000).
    local: SocketAddrV4,
    /// Which lcore receives a flow; None where the kernel picks the queue.
    placement: Option<FlowPlacement>,
}

/// What one lcore's run leaves behind.
struct LcoreRun<S> {
    service: S,
    /// Packets this lcore passed to another (software steering, or a
    /// connection ID naming the other lcore); 0 on kernel UDP.
    handed_over: u64,
}

/// Run one endpoint per lcore (one on kernel UDP) until `stop`, each with
/// the service `make` builds for it; the services come back in lcore order.
fn run_endpoint<S>(
    args: &PerfArgs,
    cfg: QuicConfig,
    server: bool,
    local: Option<SocketAddrV4>,
    route_to: Option<SocketAddrV4>,
    stop: Arc<AtomicBool>,
    make: impl Fn(&LcoreSlot) -> Result<S>,
) -> Result<Vec<LcoreRun<S>>>
where
    S: QuicService<stack::io::kernel::KernelDatagram>
        + QuicService<stack::io::dpdk::UdpMbuf>
        + Send
        + 'static,
{
    match args.transport {
        Transport::Udp => {
            let bind = local.unwrap_or_else(|| "0.0.0.0:0".parse().unwrap());
            let max_payload = match (args.max_payload, route_to) {
                (Some(p), _) => p as usize,
                (None, Some(to)) => route_payload(to, ROUTE_PAYLOAD_CAP)
                    .map_err(|e| Error::Io(format!("route MTU towards {to}"), e))?,
                (None, None) => ROUTE_PAYLOAD_CAP,
            };
            let udp = KernelUdpConfig {
                max_payload,
                ..KernelUdpConfig::default()
            };
            let mut io = KernelUdp::bind(bind, udp)
                .map_err(|e| Error::Usage(format!("bind {bind}: {e}")))?;
            let per_peer = if route_to.is_none() {
                ", or what the kernel's route to each peer carries if less"
            } else {
                ""
            };
            crate::eline!(
                "ainftp-perf: UDP payloads up to {} B{per_peer}",
                io.max_payload()
            );
            let service = make(&LcoreSlot {
                index: 0,
                lcores: 1,
                local: io.local_addr(),
                placement: Some(FlowPlacement::single_queue()),
            })?;
            let ep = new_endpoint(server, &cfg, 0, io.max_payload()).map_err(quic_err)?;
            let mut app = EndpointApp::new(ep, service);
            runtime::app_loop(
                &mut io,
                &mut app,
                &stop,
                args.idle.into(),
                &SharedCounters::default(),
            );
            Ok(vec![LcoreRun {
                service: app.service,
                handed_over: 0,
            }])
        }
        Transport::Dpdk => {
            let (_eal, rt, _arena) = dpdk_runtime(args)?;
            let ip = rt.host().ip;
            let max_payload = rt.max_payload();
            crate::eline!(
                "ainftp-perf: port MTU {}, UDP payloads up to {max_payload} B",
                rt.port().features().mtu
            );
            if let Some(l) = local.filter(|l| !l.ip().is_unspecified() && *l.ip() != ip) {
                return Err(Error::Usage(format!(
                    "--bind {l}: our DPDK stack's address is {ip} (--ip); bind {ip}:{} or 0.0.0.0:{}",
                    l.port(),
                    l.port()
                )));
            }
            // The stack owns every port of its address: "any free port"
            // (0) is the default one.
            let port = local.map_or(0, |l| l.port());
            let local = SocketAddrV4::new(ip, if port == 0 { 40_000 } else { port });
            let lcores = rt.lcores().len();
            let services = (0..lcores)
                .map(|index| {
                    make(&LcoreSlot {
                        index,
                        lcores,
                        local,
                        placement: rt.placement().cloned(),
                    })
                    .map(Some)
                })
                .collect::<Result<Vec<_>>>()?;
            let services = std::sync::Mutex::new(services);
            let (report, apps) = rt.run_apps(stop, move |i| {
                let ep = new_endpoint(server, &cfg, i as u8, max_payload).expect("config checked");
                let service = services.lock().unwrap()[i]
                    .take()
                    .expect("one service per lcore");
                EndpointApp::new(ep, service)
            })?;
            Ok(apps
                .into_iter()
                .zip(&report.per_lcore)
                .map(|(a, counters)| LcoreRun {
                    service: a.service,
                    handed_over: counters.steered,
                })
                .collect())
        }
    }
}

/// Serve the perf protocol until the duration ends or a signal.
pub fn server(args: &PerfArgs) -> Result<serde_json::Value> {
    let bind = addr("--bind", &args.bind)?;
    let (cfg, _certs) = quic_config(args, "server")?;
    // Fail on a bad config here, with a clear line, not in the lcore.
    Endpoint::<stack::io::heap::HeapDatagram>::server(cfg.clone(), 0, 1472).map_err(quic_err)?;
    let stop = stop_flag(args.server_duration())?;
    let served = run_endpoint(args, cfg, true, Some(bind), None, stop, |slot| {
        // Once bound, so that port 0 shows the port the kernel chose.
        if slot.index == 0 {
            crate::eline!(
                "ainftp-perf: quic server on {} ({}), ALPN ainftp-perf/1",
                slot.local,
                args.transport.name()
            );
        }
        Ok(PerfServer::new())
    })?;
    let closed: u64 = served.iter().map(|s| s.service.closed_count).sum();
    let per_lcore: Vec<_> = served
        .iter()
        .map(
            |s| json!({"connections_closed": s.service.closed_count, "handed_over": s.handed_over}),
        )
        .collect();
    Ok(json!({"mode": "quic-server", "connections_closed": closed, "per_lcore": per_lcore}))
}

/// One lcore's share of the client: its connections and their results.
struct Client {
    target: SocketAddrV4,
    /// Our address of each of this lcore's connections.
    locals: Vec<SocketAddrV4>,
    test: QuicTest,
    streams: usize,
    bytes: u64,
    size: u64,
    count: u64,
    warmup: u64,
    handles: Vec<(ConnHandle, Instant)>,
    /// How long a handshake may take before the run fails (zero: no limit).
    connect_timeout: Duration,
    handshake: Histogram<u64>,
    established_at: Option<Instant>,
    jobs: Vec<(ConnHandle, ClientStream)>,
    rr_started: Option<Instant>,
    rr_done: u64,
    /// Timed requests per connection (in `handles` order).
    rr_by_conn: Vec<u64>,
    latency: Histogram<u64>,
    finished_at: Option<Instant>,
    error: Option<String>,
    buf: Vec<u8>,
    /// The endpoint's counters, as of the last poll.
    endpoint: EndpointStats,
    /// Each connection's packet counts and path, taken as the test ends.
    conn_stats: Vec<ConnStats>,
    /// Lcores whose connections are not all closed yet; the last one out
    /// stops the run.
    running: Arc<AtomicUsize>,
    counted_out: bool,
    stop: Arc<AtomicBool>,
}

impl<B: Datagram> QuicService<B> for Client {
    fn poll(&mut self, ep: &mut Endpoint<B>) {
        self.endpoint = ep.stats();
        if self.locals.is_empty() {
            return self.count_out();
        }
        if self.handles.is_empty() {
            for &local in &self.locals {
                match ep.connect(local, self.target, Some("server")) {
                    Ok(h) => self.handles.push((h, Instant::now())),
                    Err(e) => return self.fail(e.to_string()),
                }
            }
        }
        while let Some(e) = ep.poll_event() {
            match e {
                Event::Established { conn, .. } => {
                    if let Some((_, t0)) = self.handles.iter().find(|(h, _)| *h == conn) {
                        let _ = self.handshake.record(t0.elapsed().as_micros() as u64);
                    }
                }
                Event::Closed {
                    reason,
                    established,
                    ..
                } if self.finished_at.is_none() => {
                    let hint = match !established && reason.is_certificate_trouble() {
                        true => {
                            " (do both ends have certificates from the same cluster CA? --certs)"
                        }
                        false => "",
                    };
                    return self.fail(format!(
                        "connection to {} closed early: {reason}{hint}",
                        self.target
                    ));
                }
                Event::Closed { .. } => {}
            }
        }
        if self.established_at.is_none() {
            let waiting = self.handles.iter().find(|(h, _)| !ep.is_established(*h));
            if let Some((_, t0)) = waiting {
                if !self.connect_timeout.is_zero() && t0.elapsed() > self.connect_timeout {
                    return self.fail(format!(
                        "no QUIC server answered at {} within {:.1} s (--connect-timeout)",
                        self.target,
                        self.connect_timeout.as_secs_f64()
                    ));
                }
                return;
            }
            self.established_at = Some(Instant::now());
            if self.test == QuicTest::Bulk {
                for &(h, _) in &self.handles {
                    for _ in 0..self.streams {
                        let id = ep.open_bidi(h).expect("open connection");
                        self.jobs
                            .push((h, ClientStream::new(id, MODE_DISCARD, self.bytes)));
                    }
                }
            }
        }
        match self.test {
            QuicTest::Bulk => {
                for (h, s) in &mut self.jobs {
                    s.poll(ep, *h, &mut self.buf);
                }
                if self.jobs.iter().all(|(_, s)| s.is_done()) {
                    self.finish(ep);
                }
            }
            QuicTest::Rr => self.poll_rr(ep),
        }
    }
}

impl Client {
    fn fail(&mut self, why: String) {
        self.error.get_or_insert(why);
        self.stop.store(true, Ordering::Relaxed);
    }

    fn finish<B: Datagram>(&mut self, ep: &mut Endpoint<B>) {
        if self.finished_at.is_none() {
            self.finished_at = Some(Instant::now());
            for &(h, _) in &self.handles {
                self.conn_stats.extend(ep.conn_stats(h).ok());
                let _ = ep.close(h, 0, b"done");
            }
        }
        if ep.connections() == 0 {
            self.count_out();
        }
    }

    fn count_out(&mut self) {
        if !self.counted_out {
            self.counted_out = true;
            if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.stop.store(true, Ordering::Relaxed);
            }
        }
    }

    fn poll_rr<B: Datagram>(&mut self, ep: &mut Endpoint<B>) {
        if self.finished_at.is_some() {
            return self.finish(ep);
        }
        if self.jobs.is_empty() {
            // One request at a time, taking the connections in turn.
            let h = self.handles[self.rr_done as usize % self.handles.len()].0;
            let id = ep.open_bidi(h).expect("open connection");
            self.jobs
                .push((h, ClientStream::new(id, MODE_ECHO, self.size)));
            self.rr_started = Some(Instant::now());
        }
        let (h, s) = &mut self.jobs[0];
        s.poll(ep, *h, &mut self.buf);
        let (done, correct, id) = (s.is_done(), s.is_correct(), s.id);
        if done {
            if !correct {
                return self.fail(format!("echo mismatch on stream {id}"));
            }
            if self.rr_done >= self.warmup {
                let rtt = self.rr_started.expect("started").elapsed();
                let _ = self.latency.record(rtt.as_nanos() as u64);
                let conn = self.rr_done as usize % self.handles.len();
                self.rr_by_conn[conn] += 1;
            }
            self.rr_done += 1;
            self.jobs.clear();
            if self.rr_done == self.warmup {
                self.established_at = Some(Instant::now());
            }
            if self.rr_done >= self.warmup + self.count {
                self.finish(ep);
            }
        }
    }
}

/// Our address for each connection that lcore `slot.index` owns
/// (connection c goes to lcore c % lcores). On one kernel socket they all
/// share its address (connection IDs tell them apart). On our stack each
/// has its own port, picked, where the runtime knows how flows are placed,
/// so that the server's replies land on the lcore that owns the connection:
/// no hand-off between lcores. Where the kernel picks the rx queue
/// (net_tap, net_af_xdp), replies that reach another lcore are handed over
/// by connection ID.
fn connection_locals(
    slot: &LcoreSlot,
    conns: usize,
    target: SocketAddrV4,
    own_ports: bool,
) -> Result<Vec<SocketAddrV4>> {
    let mine: Vec<usize> = (0..conns)
        .filter(|c| c % slot.lcores == slot.index)
        .collect();
    if !own_ports {
        return Ok(vec![slot.local; mine.len()]);
    }
    let ip = *slot.local.ip();
    let Some(placement) = slot.placement.as_ref() else {
        let port = |c: usize| {
            u16::try_from(usize::from(slot.local.port()) + c)
                .map(|p| SocketAddrV4::new(ip, p))
                .map_err(|_| Error::Usage(format!("no local port for connection {c}")))
        };
        return mine.into_iter().map(port).collect();
    };
    let mut from = Some(slot.local.port());
    let mut locals = Vec::with_capacity(mine.len());
    for _ in mine {
        let port = from
            .and_then(|f| placement.source_port_for(slot.index as u16, ip, target, f))
            .ok_or_else(|| {
                Error::Usage(format!(
                    "no local port from {} up takes replies to lcore {}",
                    slot.local.port(),
                    slot.index
                ))
            })?;
        locals.push(SocketAddrV4::new(ip, port));
        from = port.checked_add(1);
    }
    Ok(locals)
}

/// Lcore `index`'s part of `total` split over `parts` lcores, the first
/// ones taking one more where it does not divide.
fn share(total: u64, index: usize, parts: usize) -> u64 {
    let parts = parts.max(1) as u64;
    total / parts + u64::from((index as u64) < total % parts)
}

/// Bulk goodput or request/response latency against `--target`.
pub fn client(args: &PerfArgs) -> Result<serde_json::Value> {
    let target = addr("--target", &args.target)?;
    if args.transport == Transport::Dpdk {
        // Before DPDK starts: a target the port cannot route to is the
        // user's to fix.
        let port = dpdk_ports(args, 1)?.remove(0);
        let mut rt = RuntimeConfig::new(&port.device, port.ip, port.prefix);
        rt.gateway = port.gateway;
        if crate::dp::config::next_hop(&rt, *target.ip()).is_none() {
            return Err(Error::Usage(format!(
                "--target {target} is outside {}/{} (--ip) and there is no --gateway: the stack could send it nothing",
                port.ip, port.prefix
            )));
        }
    }
    let (cfg, _certs) = quic_config(args, "client")?;
    Endpoint::<stack::io::heap::HeapDatagram>::client(cfg.clone(), 0, 1472).map_err(quic_err)?;
    let stop = stop_flag(0.0)?;
    let (test, streams, bytes) = (args.test, args.streams, args.bytes);
    let conns = args.conns;
    let (size, count, warmup) = (args.size as u64, args.count, args.warmup);
    let transport = args.transport;
    let client_stop = stop.clone();
    let running = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let runs = run_endpoint(args, cfg, false, None, Some(target), stop, |slot| {
        // Every lcore counts itself in before any of them runs.
        running.fetch_add(1, Ordering::Relaxed);
        let locals = connection_locals(slot, conns, target, transport == Transport::Dpdk)?;
        // --count and --warmup are the run's, split over the lcores that
        // have connections (each measured them all before).
        let with_conns = slot.lcores.min(conns);
        let count = share(count, slot.index, with_conns);
        let warmup = share(warmup, slot.index, with_conns);
        if test == QuicTest::Rr && !locals.is_empty() && count == 0 {
            return Err(Error::Usage(format!(
                "--count {}: fewer round trips than the {with_conns} lcores with connections (each measures at least one)",
                args.count
            )));
        }
        Ok(Client {
            target,
            rr_by_conn: vec![0; locals.len()],
            locals,
            test,
            streams,
            bytes,
            size,
            count,
            warmup,
            handles: Vec::new(),
            connect_timeout: Duration::from_secs_f64(args.connect_timeout.unwrap_or(10.0)),
            handshake: Histogram::new(3).expect("histogram"),
            established_at: None,
            jobs: Vec::new(),
            rr_started: None,
            rr_done: 0,
            latency: Histogram::new(3).expect("histogram"),
            finished_at: None,
            error: None,
            buf: vec![0; 256 * 1024],
            endpoint: EndpointStats::default(),
            conn_stats: Vec::new(),
            running: running.clone(),
            counted_out: false,
            stop: client_stop.clone(),
        })
    })?;
    let clients: Vec<&Client> = runs.iter().map(|r| &r.service).collect();
    if let Some(e) = clients.iter().find_map(|c| c.error.as_ref()) {
        return Err(Error::Usage(format!("quic client: {e}")));
    }
    // The run spans the first lcore's start to the last lcore's finish.
    let active: Vec<&Client> = clients
        .iter()
        .copied()
        .filter(|c| !c.locals.is_empty())
        .collect();
    let spans: Option<Vec<(Instant, Instant)>> = active
        .iter()
        .map(|c| Some((c.established_at?, c.finished_at?)))
        .collect();
    let Some(spans) = spans else {
        return Err(Error::Usage(format!(
            "quic client: stopped before finishing after {:.1} s (is the server up at {target}?)",
            started.elapsed().as_secs_f64()
        )));
    };
    let t0 = spans.iter().map(|s| s.0).min().expect("a connection");
    let t1 = spans.iter().map(|s| s.1).max().expect("a connection");
    let secs = (t1 - t0).as_secs_f64().max(1e-9);
    let mut handshake = Histogram::<u64>::new(3).expect("histogram");
    let mut latency = Histogram::<u64>::new(3).expect("histogram");
    for c in &active {
        handshake.add(&c.handshake).expect("same histogram bounds");
        latency.add(&c.latency).expect("same histogram bounds");
    }
    let per_lcore: Vec<_> = runs
        .iter()
        .map(|r| {
            let c = &r.service;
            json!({"conns": c.locals.len(), "datagrams_in": c.endpoint.datagrams_in,
                   "unknown_connection": c.endpoint.unknown_connection,
                   "handed_over": r.handed_over})
        })
        .collect();
    let paths: Vec<&ConnStats> = active.iter().flat_map(|c| &c.conn_stats).collect();
    let sent: usize = paths.iter().map(|p| p.packets_sent).sum();
    let lost: usize = paths.iter().map(|p| p.packets_lost).sum();
    let rtt_us = paths
        .iter()
        .map(|p| p.rtt.as_secs_f64() * 1e6)
        .fold(0.0, f64::max);
    // What path MTU discovery settled on, the smallest over the connections.
    let max_datagram = paths.iter().map(|p| p.max_datagram).min().unwrap_or(0);
    let lcores = clients.len();
    let transport = transport.name();
    let hs_us = handshake.value_at_quantile(0.5);
    match args.test {
        QuicTest::Bulk => {
            let jobs = active.iter().flat_map(|c| &c.jobs);
            if let Some((_, bad)) = jobs.clone().find(|(_, s)| !s.is_correct()) {
                return Err(Error::Usage(format!(
                    "server's count wrong on stream {}",
                    bad.id
                )));
            }
            let total: u64 = jobs.map(|(_, s)| s.bytes()).sum();
            let gbps = total as f64 * 8.0 / secs / 1e9;
            // Each connection's own goodput over the run (its streams'
            // bytes), keyed by lcore and connection.
            let mut by_conn: std::collections::BTreeMap<(usize, ConnHandle), u64> =
                Default::default();
            for (lcore, c) in active.iter().enumerate() {
                for (h, s) in &c.jobs {
                    *by_conn.entry((lcore, *h)).or_default() += s.bytes();
                }
            }
            let gbps_by_conn: Vec<f64> = by_conn
                .values()
                .map(|&b| b as f64 * 8.0 / secs / 1e9)
                .collect();
            let (lo, hi) = gbps_by_conn
                .iter()
                .fold((f64::MAX, 0f64), |(lo, hi), &g| (lo.min(g), hi.max(g)));
            crate::eline!(
                "quic bulk over {transport}: {total} bytes in {secs:.3} s = {gbps:.3} Gbit/s \
                 ({conns} conns x {streams} streams on {lcores} lcore(s), per conn {lo:.3} to {hi:.3} Gbit/s); \
                 handshake p50 {hs_us} us; {lost} of {sent} packets lost, rtt {rtt_us:.0} us, \
                 datagrams up to {max_datagram} B"
            );
            Ok(
                json!({"mode": "quic-client", "test": "bulk", "transport": transport,
                      "bytes": total, "seconds": secs, "gbps": gbps,
                      "gbps_per_conn": gbps / conns as f64, "gbps_by_conn": gbps_by_conn,
                      "conns": conns, "streams": streams,
                      "handshake_p50_us": hs_us, "lcores": lcores, "per_lcore": per_lcore,
                      "packets_sent": sent, "packets_lost": lost, "rtt_us": rtt_us,
                      "max_datagram": max_datagram}),
            )
        }
        QuicTest::Rr => {
            let q = |p: f64| latency.value_at_quantile(p) as f64 / 1000.0;
            // Connection c is lcore c % lcores's (c / lcores)-th.
            let mut by_conn = vec![0u64; conns];
            for (lcore, c) in clients.iter().enumerate() {
                for (k, &n) in c.rr_by_conn.iter().enumerate() {
                    by_conn[k * lcores + lcore] = n;
                }
            }
            crate::eline!(
                "quic rr over {transport}: {} requests of {size} B, p50 {:.1} us p99 {:.1} us p999 {:.1} us; handshake {hs_us} us",
                latency.len(),
                q(0.5),
                q(0.99),
                q(0.999)
            );
            Ok(
                json!({"mode": "quic-client", "test": "rr", "transport": transport,
                      "requests": latency.len(), "size": size, "p50_us": q(0.5),
                      "p99_us": q(0.99), "p999_us": q(0.999), "handshake_us": hs_us,
                      "conns": conns, "requests_by_conn": by_conn,
                      "lcores": lcores, "per_lcore": per_lcore,
                      "packets_sent": sent, "packets_lost": lost, "rtt_us": rtt_us,
                      "max_datagram": max_datagram}),
            )
        }
    }
}

/// Where `--certs` points, checked early with the fix in the message.
pub fn check_certs(dir: &Option<PathBuf>) -> Result<()> {
    if let Some(d) = dir {
        if !d.join("ca.pem").exists() {
            return Err(Error::Usage(format!(
                "--certs {}: no ca.pem there (make one: ainftp-dp certs --dir {} --ca --node server --node client)",
                d.display(),
                d.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::share;

    #[test]
    fn a_count_split_over_lcores_adds_up_to_the_count() {
        for (total, parts) in [(10_000, 2), (10_001, 2), (7, 3), (3, 4), (0, 2), (5, 1)] {
            let shares: Vec<u64> = (0..parts).map(|i| share(total, i, parts)).collect();
            assert_eq!(shares.iter().sum::<u64>(), total, "{total} over {parts}");
            let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
            assert!(hi - lo <= 1, "{total} over {parts}: {shares:?}");
        }
    }
}
