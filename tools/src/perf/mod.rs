//! ainftp-perf's packet modes: set up ports and lcores, run the forwarding
//! loops, report like testpmd.

pub mod applies;
pub mod args;
pub mod coll;
pub mod fwd;
pub mod gpu;
pub mod packet;
pub mod quic;
pub mod report;
pub mod tcp;
pub mod udp;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use dpdk_ffi::{lcore, Mempool, Port, PortConfig, DEFAULT_DATA_ROOM};

use crate::cpulist;
use crate::eal_setup::{self, EalOptions};
use crate::error::{Error, Result};
use args::{Mode, PerfArgs};
use fwd::{DropCounters, Engine, Stream};
use report::{Snapshot, Summary};

/// Run a packet mode to completion (duration or signal) and return its
/// summary; the periodic statistics are printed on the way.
pub fn run(args: &PerfArgs) -> Result<Summary> {
    validate(args)?;
    // Before DPDK starts: a signal while it sets up (or waits for links)
    // ends the run through the same cleanup (EAL files, ports), not at once.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| Error::Io("installing the signal handler".into(), e))?;
    }
    let lcores = match &args.lcores {
        Some(list) => cpulist::parse_lcores_flag(list)?,
        None => eal_setup::default_lcores()?,
    };
    let eal = eal_setup::init(&EalOptions {
        lcores: &lcores,
        pci: &args.pci,
        extra: &args.eal_args,
    })?;

    let devices: Vec<String> = args.pci.iter().chain(&args.vdev).cloned().collect();
    let workers = eal.worker_lcores();
    let fwd_lcores = workers.len().max(1);
    let pool = Mempool::new(
        &eal,
        "perf_pool",
        pool_size(devices.len(), args, fwd_lcores),
        256,
        DEFAULT_DATA_ROOM,
        None,
    )?;
    let cfg = PortConfig {
        rx_queues: args.queues,
        tx_queues: args.queues,
        rx_descriptors: args.descriptors,
        tx_descriptors: args.descriptors,
        ..PortConfig::default()
    };
    let ports = devices
        .iter()
        .map(|d| Port::open(&eal, d, &cfg, &pool))
        .collect::<std::result::Result<Vec<_>, _>>()?;

    wait_for_links(&ports, Duration::from_secs_f64(args.link_wait), &stop);
    let drops: DropCounters = Arc::new(
        (0..ports.len())
            .map(|_| CachePadded::new(AtomicU64::new(0)))
            .collect(),
    );
    let streams = build_streams(args, &ports)?;
    let per_lcore = spread(streams, fwd_lcores);
    print_banner(args, &ports, &per_lcore, &workers, eal.main_lcore());

    let engine = Arc::new(Engine {
        mode: args.mode,
        burst: args.burst as usize,
        idle: args.idle,
        tx_first: args.tx_first && matches!(args.mode, Mode::Io | Mode::Macswap),
        pool: pool.clone(),
        stop: stop.clone(),
        drops: drops.clone(),
    });
    let monitor = Monitor {
        ports: ports.clone(),
        drops,
        stop: stop.clone(),
        duration: Some(args.packet_duration())
            .filter(|&s| s > 0.0)
            .map(Duration::from_secs_f64),
        period: (args.stats_period > 0.0).then(|| Duration::from_secs_f64(args.stats_period)),
        mode: args.mode,
    };

    let summary = if workers.is_empty() {
        // One lcore: it forwards, a plain thread reports.
        let mon = std::thread::spawn(move || monitor.run());
        let streams = per_lcore.into_iter().next().unwrap_or_default();
        fwd::run(&engine, streams);
        mon.join().expect("stats thread")
    } else {
        let mut jobs = Vec::new();
        for (lc, streams) in workers.iter().zip(per_lcore) {
            let engine = engine.clone();
            jobs.push(lcore::launch(&eal, *lc, move || {
                fwd::run(&engine, streams)
            })?);
        }
        let summary = monitor.run();
        for j in jobs {
            j.join()?;
        }
        summary
    };
    report::print_summary(&summary);
    Ok(summary)
}

fn validate(args: &PerfArgs) -> Result<()> {
    if !matches!(
        args.mode,
        Mode::Io | Mode::Macswap | Mode::Rxonly | Mode::Txonly
    ) {
        return Err(Error::Usage(format!(
            "{} runs on kernel sockets: see perf::udp",
            args.mode.name()
        )));
    }
    if args.pci.is_empty() && args.vdev.is_empty() {
        return Err(Error::Usage(
            "no port given: add --vdev net_null0 (virtual) or --pci 0000:3b:00.0 (a NIC bound to vfio-pci)".into(),
        ));
    }
    if let Some(m) = &args.eth_peer {
        packet::parse_mac(m).map_err(|e| Error::Usage(format!("--eth-peer: {e}")))?;
    }
    Ok(())
}

/// Wait until every link is up (memif and tap links come up after start).
fn wait_for_links(ports: &[Port], limit: Duration, stop: &AtomicBool) {
    let deadline = Instant::now() + limit;
    while let Some(down) = ports.iter().find(|p| !p.link().up) {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                port = down.name(),
                "link still down after {limit:?}; forwarding anyway"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Enough mbufs for every descriptor ring, every burst in flight and the
/// per-lcore caches, rounded to 2^k - 1 (the mempool's best size).
fn pool_size(ports: usize, args: &PerfArgs, lcores: usize) -> u32 {
    let descriptors = if args.descriptors == 0 {
        4096
    } else {
        args.descriptors as usize
    };
    let per_queue = 2 * descriptors + 2 * fwd::MAX_BURST;
    let n = ports * args.queues as usize * per_queue + (lcores + 1) * 256 + 4096;
    (n + 1).next_power_of_two() as u32 - 1
}

/// Port i forwards to its pair (0<->1, 2<->3); an odd last port to itself.
fn peer_of(i: usize, n: usize) -> usize {
    if i ^ 1 < n {
        i ^ 1
    } else {
        i
    }
}

fn build_streams(args: &PerfArgs, ports: &[Port]) -> Result<Vec<Stream>> {
    let peer_mac = args
        .eth_peer
        .as_deref()
        .map(packet::parse_mac)
        .transpose()?;
    let mut streams = Vec::new();
    for (pi, port) in ports.iter().enumerate() {
        let peer = peer_of(pi, ports.len());
        for q in 0..args.queues {
            let tx_port = if args.mode == Mode::Txonly { pi } else { peer };
            let dst = peer_mac.unwrap_or([2, 0, 0, 0, 0, peer as u8]);
            let frame = packet::udp_frame(ports[tx_port].mac(), dst, args.pkt_size as usize);
            streams.push(match args.mode {
                Mode::Io | Mode::Macswap => Stream::new(
                    Some(port.rx_queue(q)?),
                    Some(ports[peer].tx_queue(q)?),
                    peer,
                    frame,
                ),
                Mode::Rxonly => Stream::new(Some(port.rx_queue(q)?), None, pi, frame),
                Mode::Txonly => Stream::new(None, Some(port.tx_queue(q)?), pi, frame),
                _ => unreachable!("validate() keeps the socket and QUIC modes out"),
            });
        }
    }
    Ok(streams)
}

/// Round-robin the streams over the forwarding lcores.
fn spread(streams: Vec<Stream>, lcores: usize) -> Vec<Vec<Stream>> {
    let mut out: Vec<Vec<Stream>> = (0..lcores).map(|_| Vec::new()).collect();
    for (i, s) in streams.into_iter().enumerate() {
        out[i % lcores].push(s);
    }
    out
}

fn print_banner(
    args: &PerfArgs,
    ports: &[Port],
    per_lcore: &[Vec<Stream>],
    workers: &[u32],
    main: u32,
) {
    crate::oline!(
        "{} packet forwarding - ports={} - cores={} - streams={} - burst={} - {}",
        args.mode.name(),
        ports.len(),
        per_lcore.len(),
        per_lcore.iter().map(Vec::len).sum::<usize>(),
        args.burst,
        dpdk_ffi::Eal::version()
    );
    for (i, p) in ports.iter().enumerate() {
        let f = p.features();
        crate::oline!(
            "  port {i}: {} ({}) mac {} rxq={} txq={} rss={} link={}",
            p.name(),
            p.info().driver,
            packet::format_mac(p.mac()),
            f.rx_queues,
            f.tx_queues,
            if f.rss_hf != 0 { "on" } else { "off" },
            if p.link().up { "up" } else { "down" }
        );
    }
    for (k, streams) in per_lcore.iter().enumerate() {
        let lc = workers.get(k).copied().unwrap_or(main);
        let desc: Vec<String> = streams
            .iter()
            .map(|s| {
                let rx =
                    s.rx.as_ref()
                        .map(|q| format!("RX P={}/Q={}", q.port_id(), q.queue_id()));
                let tx =
                    s.tx.as_ref()
                        .map(|q| format!("TX P={}/Q={}", q.port_id(), q.queue_id()));
                [rx, tx]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(" -> ")
            })
            .collect();
        crate::oline!("  lcore {lc} streams: {}", desc.join(", "));
    }
}

struct Monitor {
    ports: Vec<Port>,
    drops: DropCounters,
    stop: Arc<AtomicBool>,
    duration: Option<Duration>,
    period: Option<Duration>,
    mode: Mode,
}

impl Monitor {
    fn snapshot(&self) -> Vec<Snapshot> {
        self.ports
            .iter()
            .enumerate()
            .map(|(i, p)| Snapshot::take(p, self.drops[i].load(Ordering::Relaxed)))
            .collect()
    }

    /// Print statistics each period until the duration ends or a signal
    /// arrives; then stop the loops and sum up.
    fn run(self) -> Summary {
        let start = self.snapshot();
        let t0 = Instant::now();
        let mut last = start.clone();
        let mut next_print = self.period.map(|p| t0 + p);
        let end = self.duration.map(|d| t0 + d);
        let tick = Duration::from_millis(20);
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if end.is_some_and(|e| now >= e) {
                break;
            }
            if let (Some(at), Some(p)) = (next_print, self.period) {
                if now >= at {
                    let cur = self.snapshot();
                    for (i, port) in self.ports.iter().enumerate() {
                        let r = report::rates(port.name(), &last[i], &cur[i]);
                        report::print_period(i, &cur[i], &start[i], &r);
                    }
                    last = cur;
                    next_print = Some(at + p);
                }
            }
            let mut wake = now + tick;
            if let Some(e) = end {
                wake = wake.min(e);
            }
            std::thread::sleep(wake.saturating_duration_since(Instant::now()));
        }
        let fin = self.snapshot();
        self.stop.store(true, Ordering::Relaxed);
        let ports: Vec<_> = self
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| report::rates(p.name(), &start[i], &fin[i]))
            .collect();
        Summary {
            mode: self.mode.name().into(),
            duration_s: fin[0].at.duration_since(start[0].at).as_secs_f64(),
            total_rx_pps: ports.iter().map(|p| p.rx_pps).sum(),
            total_tx_pps: ports.iter().map(|p| p.tx_pps).sum(),
            ports,
        }
    }
}
