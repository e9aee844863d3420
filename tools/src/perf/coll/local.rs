//! `--local-ranks N`: this binary starts N copies of itself, one rank
//! each, with the torchrun variables and a rendezvous on 127.0.0.1.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Set in the children so they run as ranks instead of spawning.
pub const CHILD_VAR: &str = "AINFTP_PERF_LOCAL_CHILD";
/// The CPU a child rank's lane 0 runs on (kernel-UDP ranks pin
/// themselves to it; DPDK ranks are pinned there by EAL, from the
/// `--lcores` the launcher gives them); its other lanes' CPUs follow from
/// it (`lane_cpus`).
const CPU_VAR: &str = "AINFTP_PERF_LOCAL_CPU";

/// Whether this process is one of the ranks `spawn_ranks` started.
pub fn is_child() -> bool {
    std::env::var_os(CHILD_VAR).is_some()
}

/// In a child rank: pin this thread (and the threads it starts later) to
/// the CPU the launcher gave it. Left to itself the scheduler's wake-affine
/// placement tends to stack two ranks that wake each other on one CPU,
/// where every exchange waits for a context switch (small all-reduces went
/// from about 27 us to about 100 us in one run out of several).
pub fn pin_child() {
    let Some(cpu) = std::env::var(CPU_VAR).ok().and_then(|v| v.parse().ok()) else {
        return;
    };
    if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
        tracing::warn!("could not pin this rank to CPU {cpu}; running unpinned");
    }
}

/// In a child rank, before `pin_child`: the CPU of each of its `lanes`
/// lanes. Lane k of the rank on the i-th allowed CPU goes to the
/// (i + k * world)-th (round robin), so ranks and lanes get CPUs of their
/// own while there are enough. Lane 0 is the rank's own thread (pinned by
/// `pin_child`, or on DPDK by EAL). Call it before anything pins this
/// thread: the allowed CPUs are this thread's. Outside `--local-ranks`:
/// unpinned.
pub fn lane_cpus(lanes: usize) -> Vec<Option<usize>> {
    let mine = std::env::var(CPU_VAR)
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let world = std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let allowed: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    let (Some(mine), Some(world)) = (mine, world) else {
        return vec![None; lanes];
    };
    let Some(i) = allowed.iter().position(|&c| c == mine) else {
        return vec![None; lanes];
    };
    (0..lanes)
        .map(|k| Some(allowed[(i + k * world) % allowed.len()]))
        .collect()
}

/// A port P such that P .. P + count - 1 are free on every address: the
/// rendezvous of lane k listens on P + k. (Another process may still take
/// one before rank 0 binds it; the rank then says so.)
fn free_ports(count: usize) -> Result<u16> {
    let err = |e| Error::Io("picking rendezvous ports".into(), e);
    for _ in 0..64 {
        let first = TcpListener::bind("0.0.0.0:0").map_err(err)?;
        let port = first.local_addr().map_err(err)?.port();
        let block = (1..count).map(|k| {
            u16::try_from(usize::from(port) + k)
                .ok()
                .and_then(|p| TcpListener::bind(("0.0.0.0", p)).ok())
        });
        // Held together, so each bind is checked against the others.
        let held: Option<Vec<TcpListener>> = block.collect();
        if held.is_some() {
            return Ok(port);
        }
    }
    Err(Error::Usage(format!(
        "found no {count} consecutive free TCP ports for the lanes' rendezvous"
    )))
}

/// The ranks' job id: `AINFTP_JOB_ID` if set (checked here, once, not by
/// each rank), else one of this launch's own, so that another launch that
/// picked the same ports in the moment between their check and rank 0's
/// bind does not join these ranks. The PID alone could repeat across PID
/// namespaces (containers on the host's network), the start time with it
/// does not.
fn job_id() -> Result<String> {
    match std::env::var("AINFTP_JOB_ID") {
        Ok(id) if !id.is_empty() => {
            collectives::driver::rendezvous::check_job_id(&id)
                .map_err(|e| Error::Usage(format!("AINFTP_JOB_ID: {e}")))?;
            Ok(id)
        }
        _ => {
            let since_epoch = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            Ok(format!(
                "local-{}-{:x}",
                std::process::id(),
                since_epoch.as_nanos() as u64
            ))
        }
    }
}

/// Starts the ranks (rank r with `rank_args(r)` before our own arguments)
/// and waits for all of them; the rendezvous ports of `lanes` lanes are
/// checked free first. Rank r is told to pin itself to the r-th of
/// the CPUs this process may run on (round robin). Once one fails, the
/// others get `grace` to fail on their own (they report the cause) before
/// they are killed. `interrupted` (a signal, installed by the caller
/// before it built anything to clean up) stops the ranks and returns, so
/// the caller's cleanup (the virtual network of --transport dpdk) runs.
pub fn spawn_ranks(
    n: usize,
    lanes: usize,
    grace: Duration,
    interrupted: &AtomicBool,
    rank_args: impl Fn(usize) -> Vec<String>,
) -> Result<()> {
    let port = free_ports(lanes)?;
    let job = job_id()?;
    let exe = std::env::current_exe().map_err(|e| Error::Io("finding this binary".into(), e))?;
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let cpus: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    let mut children: Vec<(usize, Child)> = Vec::with_capacity(n);
    for r in 0..n {
        if interrupted.load(Ordering::Relaxed) {
            stop_all(&mut children);
            return Err(Error::Usage("interrupted; ranks stopped".into()));
        }
        let spawned = Command::new(&exe)
            .args(rank_args(r))
            .args(&args)
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            // The rendezvous is on `port`, which this launcher found free.
            .env_remove(collectives::driver::rendezvous::RDV_PORT_VAR)
            .env_remove("TORCHELASTIC_USE_AGENT_STORE")
            .env("AINFTP_JOB_ID", &job)
            .env(CHILD_VAR, "1")
            .envs(
                cpus.get(r % cpus.len().max(1))
                    .map(|cpu| (CPU_VAR, cpu.to_string())),
            )
            .stdin(Stdio::null())
            .stdout(if r == 0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn();
        match spawned {
            Ok(child) => children.push((r, child)),
            Err(e) => {
                // The ranks already started would wait for this one.
                stop_all(&mut children);
                return Err(Error::Io(format!("starting rank {r}"), e));
            }
        }
    }
    let mut failures = Vec::new();
    let mut kill_at: Option<Instant> = None;
    while !children.is_empty() {
        if interrupted.load(Ordering::Relaxed) {
            stop_all(&mut children);
            return Err(Error::Usage("interrupted; ranks stopped".into()));
        }
        let mut i = 0;
        while i < children.len() {
            match children[i].1.try_wait() {
                Ok(Some(status)) => {
                    let (r, _) = children.remove(i);
                    if !status.success() {
                        failures.push(format!("rank {r} exited with {status}"));
                        kill_at.get_or_insert(Instant::now() + grace);
                    }
                }
                Ok(None) => i += 1,
                Err(e) => return Err(Error::Io("waiting for a rank".into(), e)),
            }
        }
        if kill_at.is_some_and(|t| Instant::now() > t) {
            for (r, _) in &children {
                failures.push(format!("rank {r} killed after the others failed"));
            }
            stop_all(&mut children);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Error::Usage(failures.join("; ")))
    }
}

/// Kills and reaps every rank in `children`.
fn stop_all(children: &mut Vec<(usize, Child)>) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    children.clear();
}
