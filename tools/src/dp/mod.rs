//! ainftp-dp: bring a port up as an IPv4 host on the stack's lcore runtime,
//! run the configured UDP services, print statistics, stop on a signal.

pub mod args;
pub mod certs;
pub mod config;
mod report;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stack::runtime::{Echo, PingReply, PingState, Pinger, Runtime, Services, ServicesApp};

use crate::arena_pool::ArenaPool;
use crate::eal_setup::{self, EalOptions};
use crate::error::{Error, Result};
pub use report::Summary;

pub fn run(args: &args::DpArgs) -> Result<Summary> {
    let mut plan = config::plan(args)?;
    if let Some(tap) = &plan.default_tap {
        // net_tap would join an existing TAP device as more queues, and
        // the kernel would then spread traffic over two appliances.
        if std::path::Path::new("/sys/class/net").join(tap).exists() {
            return Err(Error::Usage(format!(
                "{tap} already exists (another ainftp-dp?): name another TAP device with --tap-iface"
            )));
        }
    }
    // --ping's reply lines are printed here, off the lcores: a slow
    // stderr must not stall the data plane (a full channel skips lines
    // instead). Started before EAL pins this thread to the main lcore, so
    // that it does not inherit that CPU.
    let (reply_tx, printer) = match plan.ping {
        Some(_) => {
            let (tx, rx) = std::sync::mpsc::sync_channel::<PingReply>(256);
            let printer = std::thread::spawn(move || {
                for r in rx {
                    crate::eline!(
                        "ainftp-dp: {} bytes from {}: icmp_seq={} time={:.1} us",
                        r.data_len + 8,
                        r.from,
                        r.seq,
                        r.rtt.as_secs_f64() * 1e6
                    );
                }
            });
            (Some(tx), Some(printer))
        }
        None => (None, None),
    };
    let eal = eal_setup::init(&EalOptions {
        lcores: &plan.lcores,
        pci: &plan.pci,
        extra: &plan.eal,
    })?;
    // Kept until the runtime is done with the pool.
    let arena = match plan.mbuf_arena {
        true => Some(ArenaPool::new(
            &eal,
            plan.runtime.mbufs,
            stack::runtime::data_room(&plan.runtime.device, plan.runtime.mtu)?,
        )?),
        false => None,
    };
    plan.runtime.pool = arena.as_ref().map(|a| a.pool().clone());
    let runtime = Runtime::start(&eal, &plan.runtime)?;
    if let Some(a) = &arena {
        crate::eprint_line(&format!("ainftp-dp: {}", a.describe()));
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| Error::Io("installing the signal handler".into(), e))?;
    }
    let port = runtime.port();
    let host = runtime.host();
    let lcores = runtime.lcores();
    crate::eline!(
        "ainftp-dp: port {} ({}) mac {} ip {}/{} lcores {:?} steering {} mtu {}; udp echo on {:?}",
        port.name(),
        port.info().driver,
        host.mac,
        host.ip,
        host.prefix_len,
        lcores,
        runtime.steering(),
        port.features().mtu,
        plan.udp_echo
    );
    let counters = runtime.counters();
    let watcher = {
        let stop = stop.clone();
        let (period, duration) = (plan.stats_period, plan.duration);
        let lcores = lcores.clone();
        std::thread::spawn(move || report::watch(&stop, &counters, &lcores, period, duration))
    };
    let echo_ports = plan.udp_echo.clone();
    let ping = plan.ping.map(|cfg| {
        crate::eline!(
            "ainftp-dp: pinging {} with {} data bytes every {:.3} s",
            cfg.target,
            cfg.data_len,
            cfg.interval.as_secs_f64()
        );
        // Our identifier, as ping's: the low bits of the process id.
        PingState::new(cfg, std::process::id() as u16)
    });
    let started = Instant::now();
    let result = runtime.run_apps(stop.clone(), |i| {
        let mut s = Services::new();
        for &p in &echo_ports {
            s.listen(p, Box::new(Echo));
        }
        // lcore 0 sends the requests; every lcore takes the replies it gets.
        Pinger::new(ServicesApp::new(s), ping.clone(), i == 0, reply_tx.clone())
    });
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    drop(reply_tx);
    let run = result.map(|(run, _apps)| run);
    // The apps, and with them the last senders, are gone: it ends.
    if let Some(p) = printer {
        let _ = p.join();
    }
    let run = run?;
    let mut summary = Summary::new(
        &run,
        &lcores,
        started.elapsed().max(Duration::from_millis(1)),
        plan.runtime.impair.is_some(),
    );
    summary.ping = ping.map(|p| report::PingSummary::new(&p.lock().expect("ping state")));
    summary.print();
    Ok(summary)
}
