//! The lcore runtime: one poll loop per lcore, each owning one rx source
//! and one tx queue, nothing shared on the fast path. Flows are spread by
//! the NIC's RSS where the PMD has it, else by software steering from the
//! lcore that owns the only rx queue (said in the log).

pub mod app;
pub mod idle;
pub mod inline;
pub mod ping;
pub mod services;

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use dpdk_ffi::{lcore, Eal, Mempool, Port, PortConfig, PortStats, Ring};

use crate::counters::{Counters, SharedCounters};
use crate::host::{Host, HostConfig, NeighbourConfig, NeighbourTable};
use crate::io::dpdk::{DpdkIo, PayloadOwner, RxSource, Steering, TxPath, UdpMbuf};
use crate::io::impair::{ImpairConfig, Impaired};
use crate::io::CountedIo;
use crate::rss::{FlowPlacement, QueueMap, DEFAULT_KEY, SYMMETRIC_KEY};
use crate::wire::EthernetAddress;

pub use app::{LcoreApp, ServicesApp};
pub use idle::{Backoff, IdlePolicy};
pub use inline::InlineStack;
pub use ping::{EchoIo, PingConfig, PingReply, PingState, Pinger};
pub use services::{Echo, Services, UdpHandler};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Dpdk(#[from] dpdk_ffi::Error),
    #[error("{0}")]
    Config(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// How flows reach the lcores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SteeringMode {
    /// RSS when the PMD has it, else software steering.
    #[default]
    Auto,
    /// The NIC spreads flows over one rx queue per lcore.
    Rss,
    /// One rx queue; its lcore hashes each flow and hands it over a ring.
    Software,
}

impl std::fmt::Display for SteeringMode {
    /// The name `FromStr` takes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SteeringMode::Auto => "auto",
            SteeringMode::Rss => "rss",
            SteeringMode::Software => "software",
        })
    }
}

impl std::str::FromStr for SteeringMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(SteeringMode::Auto),
            "rss" => Ok(SteeringMode::Rss),
            "software" | "sw" => Ok(SteeringMode::Software),
            other => Err(format!(
                "unknown steering '{other}': use auto, rss or software"
            )),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// A vdev spec or PCI address (see `dpdk_ffi::Port::open`).
    pub device: String,
    pub ip: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Option<Ipv4Addr>,
    /// Our MAC; the port's own when None.
    pub mac: Option<EthernetAddress>,
    pub vlan: Option<u16>,
    pub static_neighbours: Vec<(Ipv4Addr, EthernetAddress)>,
    pub neighbour: NeighbourConfig,
    pub steering: SteeringMode,
    /// Use a symmetric RSS key, so both directions of a flow hash alike.
    pub symmetric_rss: bool,
    pub idle: IdlePolicy,
    /// Mbufs in the pool the runtime makes (ignored with `pool`).
    pub mbufs: u32,
    /// Use this pool instead of making one: e.g. gpudirect's extbuf pool
    /// over a hugepage arena that CUDA also maps, so received payloads land
    /// in memory the GPU reaches. The port DMA-maps its external memory.
    pub pool: Option<Mempool>,
    pub mtu: Option<u16>,
    pub checksum_offload: bool,
    /// Impair what the lcores send (loss, delay, ...), for experiments.
    pub impair: Option<ImpairConfig>,
    /// Frames whose UDP payload names its lcore go to that lcore, whatever
    /// queue or hash they came by: set `quic::cid::owner_of_datagram` for
    /// QUIC, so a connection's packets reach it after its peer's address
    /// changed, and on ports whose rx queue the kernel picks. With RSS
    /// each lcore then has an inbox ring the others hand such frames to.
    /// It reads every UDP payload, whatever the port: for runtimes whose
    /// UDP is all QUIC (as the QUIC tools' and the collectives' are).
    pub payload_owner: Option<PayloadOwner>,
}

impl RuntimeConfig {
    pub fn new(device: &str, ip: Ipv4Addr, prefix_len: u8) -> RuntimeConfig {
        RuntimeConfig {
            device: device.to_owned(),
            ip,
            prefix_len,
            gateway: None,
            mac: None,
            vlan: None,
            static_neighbours: Vec::new(),
            neighbour: NeighbourConfig::default(),
            steering: SteeringMode::Auto,
            symmetric_rss: false,
            idle: IdlePolicy::Adaptive,
            mbufs: 8191,
            pool: None,
            mtu: None,
            checksum_offload: true,
            impair: None,
            payload_owner: None,
        }
    }

    /// Who the host is on the wire, once the port's `mac` is known (its
    /// addresses, routes and neighbours do not depend on it).
    pub fn host_config(&self, mac: EthernetAddress) -> HostConfig {
        let mut host = HostConfig::new(mac, self.ip, self.prefix_len);
        host.gateway = self.gateway;
        host.vlan = self.vlan;
        host.static_neighbours = self.static_neighbours.clone();
        host.neighbour = self.neighbour;
        host
    }
}

/// net_af_xdp registers its pool's memory as the socket's UMEM, which must
/// hold the mbufs themselves: it cannot take a pool whose data lies in
/// external memory (it fails with "Failed to create umem" in the log).
fn refuse_external_pool_on_af_xdp(device: &str, pool: &Mempool) -> Result<()> {
    if pool.external_memory().is_some() && is_af_xdp(device) {
        return Err(Error::Config(format!(
            "{device}: net_af_xdp cannot receive into an external-memory (arena) pool; \
             use net_tap, net_af_packet or a PCI NIC, or the default pool"
        )));
    }
    Ok(())
}

/// A mempool name no other runtime of this process has (a process may
/// run one runtime per port: one per lane of a collective, say).
fn pool_name() -> String {
    static RUNTIMES: AtomicUsize = AtomicUsize::new(0);
    let n = RUNTIMES.fetch_add(1, Ordering::Relaxed);
    format!("stack_{}_{n}", std::process::id())
}

/// Frames an lcore's inbox holds (hand-offs are the exception: a flow
/// whose queue moved, or the first packets of one the kernel placed).
const HANDOFF_RING: u32 = 1024;

/// One lcore's loop, ready to run.
pub struct Worker {
    pub index: usize,
    pub lcore: u32,
    pub io: DpdkIo,
    pub counters: Arc<SharedCounters>,
}

/// What a finished run leaves behind.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub per_lcore: Vec<Counters>,
    pub total: Counters,
    pub port: PortStats,
    /// Mbufs of our pool out when the loops started (with the port up: a
    /// PMD that keeps its receive ring stocked holds them, as net_af_xdp
    /// does its fill ring).
    pub mbufs_in_use_at_start: u32,
    /// Mbufs of our pool still out after the port closed (0: no leak).
    pub mbufs_in_use_after_close: u32,
}

pub struct Runtime {
    port: Port,
    pool: Mempool,
    eal: Eal,
    host: Arc<HostConfig>,
    workers: Vec<Worker>,
    mode: SteeringMode,
    placement: Option<FlowPlacement>,
    idle: IdlePolicy,
    impair: Option<ImpairConfig>,
}

impl Runtime {
    /// Open the port and build one worker per EAL lcore (main first).
    pub fn start(eal: &Eal, cfg: &RuntimeConfig) -> Result<Runtime> {
        let lcores: Vec<u32> = std::iter::once(eal.main_lcore())
            .chain(eal.worker_lcores())
            .collect();
        let n = lcores.len() as u16;
        // Jumbo MTUs get mbufs that hold a whole frame: the stack sends
        // and receives single-segment packets only.
        let room = data_room(&cfg.device, cfg.mtu)?;
        let pool = match &cfg.pool {
            Some(pool) => {
                refuse_external_pool_on_af_xdp(&cfg.device, pool)?;
                refuse_pool_smaller_than_frames(pool, room, cfg.mtu)?;
                pool.clone()
            }
            None => Mempool::new(eal, &pool_name(), cfg.mbufs, 256, room, None)?,
        };
        let rss_key = if cfg.symmetric_rss {
            SYMMETRIC_KEY.to_vec()
        } else {
            DEFAULT_KEY.to_vec()
        };
        let port_cfg = |rx_queues, tx_queues| PortConfig {
            rx_queues,
            tx_queues,
            rss: true,
            rss_key: (cfg.symmetric_rss && rx_queues > 1).then(|| rss_key.clone()),
            checksum_offload: cfg.checksum_offload,
            mtu: cfg.mtu,
            ..PortConfig::default()
        };
        // Software steering wants one rx queue and a tx queue per lcore;
        // PMDs that pair queues (tap, af_xdp) get one of each, and the other
        // lcores hand their frames back to the steering lcore.
        let open_for_steering = || -> Result<Port> {
            match Port::open(eal, &cfg.device, &port_cfg(1, n), &pool) {
                Ok(p) => Ok(p),
                Err(e) => {
                    tracing::info!(error = %e, "one rx queue with {n} tx queues refused; using one of each");
                    Ok(Port::open(eal, &cfg.device, &port_cfg(1, 1), &pool)?)
                }
            }
        };
        let (port, mode) = match (cfg.steering, n) {
            (_, 1) => (
                Port::open(eal, &cfg.device, &port_cfg(1, 1), &pool)?,
                SteeringMode::Rss,
            ),
            (SteeringMode::Software, _) => (open_for_steering()?, SteeringMode::Software),
            (wanted, _) => {
                let port = Port::open(eal, &cfg.device, &port_cfg(n, n), &pool)?;
                if port.features().rss_hf != 0 {
                    (port, SteeringMode::Rss)
                } else if wanted == SteeringMode::Rss {
                    return Err(Error::Config(format!(
                        "port {} ({}) has no IPv4/UDP RSS; use --steering software or auto",
                        port.name(),
                        port.info().driver
                    )));
                } else {
                    tracing::warn!(
                        port = %port.name(),
                        driver = %port.info().driver,
                        "PMD has no RSS: lcore {} receives everything and steers flows to the others in software",
                        lcores[0]
                    );
                    drop(port);
                    (open_for_steering()?, SteeringMode::Software)
                }
            }
        };
        let mac = cfg.mac.unwrap_or(EthernetAddress(port.mac()));
        let host = cfg.host_config(mac);
        host.validate().map_err(Error::Config)?;
        if let Some(i) = &cfg.impair {
            i.validate()
                .map_err(|e| Error::Config(format!("--impair: {e}")))?;
        }
        let host = Arc::new(host);
        let table = NeighbourTable::new();
        let features = port.features();

        // Software steering: one ring per lcore other than the first.
        let mut producers = Vec::new();
        let mut consumers = Vec::new();
        if mode == SteeringMode::Software {
            for i in 0..lcores.len() {
                if i == 0 {
                    producers.push(None);
                    consumers.push(None);
                    continue;
                }
                let (p, c) = Ring::spsc(eal, &format!("steer_{}_{i}", port.id()), 4096)?;
                producers.push(Some(p));
                consumers.push(Some(c));
            }
        }
        // Queues of their own and payloads that name their lcore: an inbox
        // per lcore, fed by the others.
        let mut inboxes = Vec::new();
        if let (SteeringMode::Rss, Some(_), true) = (mode, cfg.payload_owner, n > 1) {
            for i in 0..lcores.len() {
                let (p, c) = Ring::mpmc(eal, &format!("handoff_{}_{i}", port.id()), HANDOFF_RING)?;
                inboxes.push((p, Some(c)));
            }
        }
        // One tx queue for several lcores: the others return frames to lcore 0.
        let returns = if mode == SteeringMode::Software && features.tx_queues < n {
            Some(Ring::mpmc(eal, &format!("steer_ret_{}", port.id()), 8192)?)
        } else {
            None
        };
        let mut workers = Vec::new();
        for (i, &lc) in lcores.iter().enumerate() {
            let q = i as u16;
            let (rx, steering) = match mode {
                SteeringMode::Software if i == 0 => {
                    let mut s = Steering::new(rss_key.clone(), 0, std::mem::take(&mut producers))
                        .with_payload_owner(cfg.payload_owner);
                    if let Some((_, c)) = &returns {
                        s = s.with_returns(c.clone());
                    }
                    (RxSource::Queue(port.rx_queue(0)?), Some(s))
                }
                SteeringMode::Software => (RxSource::Ring(consumers[i].take().unwrap()), None),
                _ if !inboxes.is_empty() => {
                    let others = inboxes
                        .iter()
                        .enumerate()
                        .map(|(j, (p, _))| (j != i).then(|| p.clone()))
                        .collect();
                    let owner = cfg.payload_owner.expect("inboxes only with an owner");
                    let inbox = inboxes[i].1.take().expect("one inbox per lcore");
                    (
                        RxSource::QueueAndInbox(port.rx_queue(q)?, inbox),
                        Some(Steering::handoff(i, others, owner)),
                    )
                }
                _ => (RxSource::Queue(port.rx_queue(q)?), None),
            };
            let tx = match &returns {
                Some((p, _)) if i > 0 => TxPath::ToSteerer(p.clone()),
                _ => TxPath::Queue(port.tx_queue(q)?),
            };
            let io = DpdkIo::new(
                rx,
                tx,
                pool.clone(),
                Host::new(host.clone(), table.clone()),
                &features,
                steering,
            );
            workers.push(Worker {
                index: i,
                lcore: lc,
                io,
                counters: Arc::new(SharedCounters::default()),
            });
        }
        let placement = match mode {
            _ if n == 1 => Some(FlowPlacement::single_queue()),
            SteeringMode::Software => Some(FlowPlacement {
                map: QueueMap {
                    queues: n,
                    reta_size: 0,
                },
                key: rss_key.clone(),
            }),
            _ => hardware_placement(&port, n),
        };
        if placement.is_none() {
            let so = match inboxes.is_empty() {
                true => "connections cannot pick it",
                false => "frames for another lcore's connection are handed to it",
            };
            tracing::info!(
                port = %port.name(), driver = %port.info().driver,
                "which lcore receives a flow is the PMD's (or kernel's) choice; {so}"
            );
        }
        tracing::info!(
            port = %port.name(), %mac, ip = %cfg.ip, lcores = ?lcores, ?mode,
            mtu = features.mtu, "stack up"
        );
        Ok(Runtime {
            port,
            pool,
            eal: eal.clone(),
            host,
            workers,
            mode,
            placement,
            idle: cfg.idle,
            impair: cfg.impair,
        })
    }

    pub fn port(&self) -> &Port {
        &self.port
    }

    pub fn pool(&self) -> &Mempool {
        &self.pool
    }

    pub fn host(&self) -> &HostConfig {
        &self.host
    }

    pub fn steering(&self) -> SteeringMode {
        self.mode
    }

    /// Which lcore receives a flow, where this runtime can tell: one lcore,
    /// software steering, or RSS on a device whose key and redirection
    /// table we read and set. None on PMDs fed by the kernel (tap, af_xdp,
    /// af_packet), whose rx queue the kernel picks by its own hash.
    pub fn placement(&self) -> Option<&FlowPlacement> {
        self.placement.as_ref()
    }

    /// The largest UDP payload one datagram carries on this port (MTU and
    /// mbuf room permitting), as every lcore's `PacketIo` reports it.
    pub fn max_payload(&self) -> usize {
        use crate::io::PacketIo;
        self.workers[0].io.max_payload()
    }

    pub fn lcores(&self) -> Vec<u32> {
        self.workers.iter().map(|w| w.lcore).collect()
    }

    /// Live counters of each lcore, readable while `run` runs.
    pub fn counters(&self) -> Vec<Arc<SharedCounters>> {
        self.workers.iter().map(|w| w.counters.clone()).collect()
    }

    /// The stack of a one-lcore runtime, to be driven from the caller's
    /// own loop (see [`InlineStack`]), receiving on `udp_port`.
    pub fn into_inline(self, udp_port: u16) -> Result<InlineStack> {
        let Runtime {
            port,
            pool,
            eal,
            mut workers,
            ..
        } = self;
        if workers.len() != 1 {
            return Err(Error::Config(format!(
                "an inline stack runs on one lcore, not {}",
                workers.len()
            )));
        }
        let w = workers.pop().expect("one worker");
        Ok(InlineStack::new(w.io, udp_port, port, pool, eal))
    }

    /// Run every lcore's loop until `stop` is set, then drain, close the
    /// port and report. `services(i)` builds lcore i's UDP handlers.
    pub fn run<F>(self, stop: Arc<AtomicBool>, services: F) -> Result<RunReport>
    where
        F: Fn(usize) -> Services<UdpMbuf>,
    {
        self.run_apps(stop, |i| ServicesApp::new(services(i)))
            .map(|(report, _)| report)
    }

    /// Run `make(i)` on lcore i (an endpoint, a collective's shard, ...)
    /// until `stop` is set, then drain, close the port and report; the
    /// apps come back (in lcore order) for their results.
    pub fn run_apps<A, F>(self, stop: Arc<AtomicBool>, make: F) -> Result<(RunReport, Vec<A>)>
    where
        A: LcoreApp<DpdkIo> + LcoreApp<Impaired<DpdkIo>> + Send + 'static,
        F: Fn(usize) -> A,
    {
        let Runtime {
            port,
            pool,
            eal,
            workers,
            idle,
            impair,
            ..
        } = self;
        let at_start = pool.in_use();
        let mut joins = Vec::new();
        let mut first = None;
        for mut w in workers {
            let app = make(w.index);
            if w.index == 0 {
                w.io.announce();
                first = Some((w, app));
                continue;
            }
            let stop = stop.clone();
            let lc = w.lcore;
            joins.push(lcore::launch(&eal, lc, move || {
                run_worker(w, app, &stop, idle, impair)
            })?);
        }
        let (w0, app0) = first.expect("at least the main lcore");
        let mut results = vec![run_worker(w0, app0, &stop, idle, impair)];
        for j in joins {
            results.push(j.join()?);
        }
        let mut total = Counters::default();
        let (per_lcore, apps): (Vec<Counters>, Vec<A>) = results.into_iter().unzip();
        for c in &per_lcore {
            total.add(c);
        }
        let port_stats = port.stats().unwrap_or_default();
        drop(port);
        let in_use = pool.in_use();
        Ok((
            RunReport {
                per_lcore,
                total,
                port: port_stats,
                mbufs_in_use_at_start: at_start,
                mbufs_in_use_after_close: in_use,
            },
            apps,
        ))
    }
}

/// Ethernet header with one 802.1Q tag.
const MAX_L2_HEADER: usize = 18;

/// What the kernel keeps free in front of each frame it writes into an
/// AF_XDP umem chunk (XDP_PACKET_HEADROOM): net_af_xdp's chunks are our
/// mbufs, so their data room must hold it as well as the frame.
const XDP_PACKET_HEADROOM: usize = 256;

/// The largest MTU net_af_xdp receives into our pool: its umem chunks are
/// our mbufs and may not exceed a 4 KiB page (mempool header, mbuf
/// header, headroom, XDP headroom and the frame; measured on DPDK 22.11,
/// where one more byte makes the socket setup fail with EINVAL).
pub const AF_XDP_MAX_MTU: u16 = 3438;

/// net_af_xdp receives into umem chunks made of the pool's own mbufs.
fn is_af_xdp(device: &str) -> bool {
    device.starts_with("net_af_xdp")
}

/// The mbuf data room that holds a whole frame of `device` at `mtu` (the
/// port's own when `None`): what a pool handed in `RuntimeConfig::pool`
/// needs.
pub fn data_room(device: &str, mtu: Option<u16>) -> Result<u16> {
    match mtu {
        Some(mtu) => data_room_for_mtu(device, mtu),
        None => Ok(dpdk_ffi::DEFAULT_DATA_ROOM),
    }
}

fn refuse_pool_smaller_than_frames(pool: &Mempool, room: u16, mtu: Option<u16>) -> Result<()> {
    if pool.data_room() < room {
        return Err(Error::Config(format!(
            "the mempool's buffers hold {} bytes, and a frame at MTU {} needs {room}: \
             the stack handles single-segment packets only",
            pool.data_room(),
            mtu.map_or("default".to_string(), |m| m.to_string()),
        )));
    }
    Ok(())
}

/// The mbuf data room for frames of `mtu` on `device`; a clear error where
/// net_af_xdp could not receive such frames into one mbuf.
fn data_room_for_mtu(device: &str, mtu: u16) -> Result<u16> {
    let frame = mtu as usize + MAX_L2_HEADER;
    if !is_af_xdp(device) {
        return Ok(dpdk_ffi::data_room_for_frame(frame));
    }
    if mtu > AF_XDP_MAX_MTU {
        return Err(Error::Config(format!(
            "{device}: MTU {mtu} is more than net_af_xdp receives into one 4 KiB umem chunk; \
             the largest it takes here is {AF_XDP_MAX_MTU}"
        )));
    }
    Ok(dpdk_ffi::data_room_for_frame(frame + XDP_PACKET_HEADROOM))
}

/// PMDs whose rx queue the kernel chooses (its own flow hash, not the
/// device's Toeplitz key).
const KERNEL_FED_DRIVERS: [&str; 3] = ["net_tap", "net_af_xdp", "net_af_packet"];

/// RSS placement read from the device: its key, and a redirection table
/// set to entry i -> queue i % queues (what most NICs start with, but not
/// all: net_null starts with every entry on queue 0).
fn hardware_placement(port: &Port, queues: u16) -> Option<FlowPlacement> {
    if KERNEL_FED_DRIVERS.contains(&port.info().driver.as_str()) {
        return None;
    }
    let key = port.rss_key().ok().filter(|k| k.len() >= 16)?;
    let reta: Vec<u16> = (0..port.info().reta_size).map(|i| i % queues).collect();
    if port.rss_reta().ok()? != reta {
        port.set_rss_reta(&reta).ok()?;
    }
    Some(FlowPlacement {
        map: QueueMap {
            queues,
            reta_size: reta.len() as u16,
        },
        key,
    })
}

/// One lcore: the services' loop (see `app_loop`) over any backend: the
/// DPDK stack, kernel UDP sockets, or either behind an `Impaired` wrapper.
pub fn poll_loop<P: CountedIo>(
    io: &mut P,
    services: Services<P::Buf>,
    stop: &AtomicBool,
    idle: IdlePolicy,
    publish: &SharedCounters,
) -> Counters {
    app_loop(io, &mut ServicesApp::new(services), stop, idle, publish)
}

/// One lcore: `app.poll` until `stop`, backing off while idle, timers and
/// counters every so often; then `app.drain`. Returns the counters.
pub fn app_loop<P: CountedIo, A: LcoreApp<P>>(
    io: &mut P,
    app: &mut A,
    stop: &AtomicBool,
    idle: IdlePolicy,
    publish: &SharedCounters,
) -> Counters {
    let mut backoff = Backoff::new(idle);
    let total = |io: &P, app: &A| {
        let mut c = io.counters();
        c.add(&app.counters());
        c
    };
    let mut loops: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let before = io.frames_moved();
        let mut moved = app.poll(io);
        // A steering lcore whose own flows are quiet still moves the
        // others' frames: it must not nap.
        if moved == 0 && io.frames_moved() != before {
            moved = 1;
        }
        loops += 1;
        // Timers and counters need not run every iteration at full rate.
        if moved == 0 || loops.is_multiple_of(64) {
            io.poll(Instant::now());
            let mut c = total(io, app);
            c.idle_naps = backoff.naps();
            publish.publish(&c);
        }
        backoff.after_poll(moved);
    }
    app.drain(io);
    io.poll(Instant::now());
    let mut last = total(io, app);
    last.idle_naps = backoff.naps();
    publish.publish(&last);
    last
}

/// Run one worker's loop, behind an impairment when asked; the counters
/// and the app come back.
fn run_worker<A>(
    w: Worker,
    mut app: A,
    stop: &AtomicBool,
    idle: IdlePolicy,
    impair: Option<ImpairConfig>,
) -> (Counters, A)
where
    A: LcoreApp<DpdkIo> + LcoreApp<Impaired<DpdkIo>>,
{
    let Worker {
        index,
        mut io,
        counters,
        ..
    } = w;
    let c = match impair {
        None => app_loop(&mut io, &mut app, stop, idle, &counters),
        Some(mut cfg) => {
            // Each lcore draws its own random stream from the seed.
            cfg.seed = cfg.seed.wrapping_add(index as u64);
            let mut io = Impaired::new(io, cfg).expect("impairment validated at start");
            app_loop(&mut io, &mut app, stop, idle, &counters)
        }
    };
    (c, app)
}
