//! The kernel-socket modes of ainftp-perf: a UDP echo server built from
//! the stack's echo service on its kernel UDP backend, and a ping-pong
//! client that measures round trips with an HDR histogram. Together they
//! compare ainftp-dp's echo (DPDK) with the kernel's on the same link.

use std::net::{SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::json;
use stack::counters::SharedCounters;
use stack::io::kernel::{KernelUdp, KernelUdpConfig, MAX_UDP_PAYLOAD_V4};
use stack::runtime::{self, Echo, Services};

use super::args::PerfArgs;
use crate::error::{Error, Result};

pub(crate) fn addr(flag: &str, v: &Option<String>) -> Result<SocketAddrV4> {
    let v = v
        .as_ref()
        .ok_or_else(|| Error::Usage(format!("{flag} ADDR:PORT is required in this mode")))?;
    v.parse()
        .map_err(|_| Error::Usage(format!("{flag} {v:?}: expected ADDR:PORT, e.g. 10.0.0.1:7")))
}

pub(crate) fn stop_flag(duration: f64) -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| Error::Io("installing the signal handler".into(), e))?;
    }
    if duration > 0.0 {
        let s = stop.clone();
        let d = Duration::from_secs_f64(duration);
        std::thread::spawn(move || {
            std::thread::sleep(d);
            s.store(true, Ordering::Relaxed);
        });
    }
    Ok(stop)
}

/// Serve UDP echo on kernel sockets until the duration ends or a signal.
pub fn echo(args: &PerfArgs) -> Result<serde_json::Value> {
    let bind = addr("--bind", &args.bind)?;
    // Any datagram a pinger may send (--size up to 65000), not just what
    // fits a 1500-byte MTU: a bigger one was dropped unanswered. (Replies
    // go out with DF set, so off loopback the path's MTU still bounds
    // what comes back.)
    let cfg = KernelUdpConfig {
        max_payload: MAX_UDP_PAYLOAD_V4,
        ..KernelUdpConfig::default()
    };
    let mut io =
        KernelUdp::bind(bind, cfg).map_err(|e| Error::Usage(format!("--bind {bind}: {e}")))?;
    let stop = stop_flag(args.server_duration())?;
    let mut services = Services::new();
    services.listen(io.local_addr().port(), Box::new(Echo));
    let idle = args.idle.into();
    crate::eline!(
        "ainftp-perf: udp echo on {} (kernel sockets)",
        io.local_addr()
    );
    let c = runtime::poll_loop(&mut io, services, &stop, idle, &SharedCounters::default());
    Ok(json!({
        "mode": "udp-echo", "bind": io.local_addr().to_string(),
        "rx": c.rx_packets, "tx": c.tx_packets, "drops": c.total_drops(),
    }))
}

/// Consecutive probes without a reply (1 s each) after which the target
/// is taken to be dead rather than lossy.
const LOST_IN_A_ROW: u32 = 5;

/// Round trips to `--target`, one at a time, spinning on a non-blocking
/// socket (no wake-up latency in the measurement).
pub fn pingpong(args: &PerfArgs) -> Result<serde_json::Value> {
    let target = addr("--target", &args.target)?;
    let sock = UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect(target).map(|_| s))
        .and_then(|s| s.set_nonblocking(true).map(|_| s))
        .map_err(|e| Error::Io(format!("socket to {target}"), e))?;
    let stop = stop_flag(0.0)?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("valid bounds");
    let mut payload = vec![0u8; args.size as usize];
    let mut buf = vec![0u8; MAX_UDP_PAYLOAD_V4];
    // Probes without a reply in time: those timed (`lost`) and those of
    // the warm-up, kept apart so that count + lost is what was asked.
    let (mut lost, mut warmup_lost, mut stray, mut lost_in_a_row) = (0u64, 0u64, 0u64, 0u32);
    let total = args.warmup + args.count;
    // Why the run ended before `total` probes: the target went away.
    let mut ended: Option<String> = None;
    'probes: for seq in 0..total {
        if lost_in_a_row == LOST_IN_A_ROW {
            ended = Some(format!(
                "udp-pingpong: no reply from {target} to {LOST_IN_A_ROW} probes in a row (is an echo service running there?)"
            ));
            break;
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        payload[..8].copy_from_slice(&seq.to_be_bytes());
        let sent_at = Instant::now();
        if let Err(e) = sock.send(&payload) {
            ended = Some(format!("udp-pingpong: send to {target}: {e}"));
            break;
        }
        let deadline = sent_at + Duration::from_secs(1);
        loop {
            match sock.recv(&mut buf) {
                Ok(n) if n >= 8 && buf[..8] == payload[..8] => {
                    if seq >= args.warmup {
                        hist.saturating_record(sent_at.elapsed().as_nanos() as u64);
                    }
                    lost_in_a_row = 0;
                    break;
                }
                Ok(_) => stray += 1,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        if seq >= args.warmup {
                            lost += 1;
                        } else {
                            warmup_lost += 1;
                        }
                        lost_in_a_row += 1;
                        break;
                    }
                    std::hint::spin_loop();
                }
                // Connection refused: the target's port closed.
                Err(e) => {
                    ended = Some(format!("udp-pingpong: receive from {target}: {e}"));
                    break 'probes;
                }
            }
        }
    }
    if hist.is_empty() {
        return Err(Error::Usage(match ended {
            Some(why) => why,
            None => format!(
                "udp-pingpong: no round trip to {target} measured ({lost} lost, {warmup_lost} in the warm-up)"
            ),
        }));
    }
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    crate::eline!(
        "ainftp-perf: {} round trips of {} B to {target}: p50 {:.1} us  p99 {:.1} us  p999 {:.1} us  max {:.1} us  lost {lost}",
        hist.len(), args.size, us(0.5), us(0.99), us(0.999), hist.max() as f64 / 1000.0
    );
    let summary = json!({
        "mode": "udp-pingpong", "target": target.to_string(), "size": args.size,
        "count": hist.len(), "lost": lost, "warmup_lost": warmup_lost, "stray": stray,
        "p50_us": us(0.5), "p99_us": us(0.99), "p999_us": us(0.999),
        "max_us": hist.max() as f64 / 1000.0, "ended_early": ended.is_some(),
    });
    match ended {
        // What was measured is reported, and the run still fails.
        Some(why) => Err(Error::EndedEarly { summary, why }),
        None => Ok(summary),
    }
}
