//! A deterministic simulator: `N` engines in one process, a virtual clock,
//! and per-link seeded latency, jitter, bandwidth, reordering and loss.
//! The transport is reliable, so loss is modelled as retransmission after
//! an RTO (the message arrives late, never twice). Runs to completion, or
//! reports a stall (no event left while some rank waits) instead of
//! hanging.
//!
//! ```
//! use collectives::{sim::{Job, Sim, SimConfig}, Collective, Config, ReduceOp};
//! let world = 3;
//! let mut sim = Sim::new(world, Config::default(), SimConfig::default()).unwrap();
//! let mut jobs = vec![Job::new(Collective::all_reduce(ReduceOp::Sum), vec![vec![1.0f32; 5]; world])];
//! sim.run(&mut jobs).unwrap();
//! assert!(jobs[0].bufs.iter().all(|b| b == &vec![3.0f32; 5]));
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::{Error, Result};
use crate::{Collective, Config, Counters, Engine, Progress};

/// Behaviour of a link (each ordered pair of ranks has its own queue).
#[derive(Debug, Clone)]
pub struct LinkModel {
    pub latency_ns: u64,
    /// Uniform extra delay in `[0, jitter_ns)` per message.
    pub jitter_ns: u64,
    /// Serialization rate; 0 means infinite.
    pub bytes_per_sec: u64,
    /// Probability that a message is held back an extra `[0, reorder_delay_ns)`.
    pub reorder: f64,
    pub reorder_delay_ns: u64,
    /// Probability that a transmission is lost (then retransmitted after `rto_ns`).
    pub loss: f64,
    pub rto_ns: u64,
}

impl Default for LinkModel {
    fn default() -> Self {
        LinkModel {
            latency_ns: 10_000,
            jitter_ns: 2_000,
            bytes_per_sec: 10_000_000_000,
            reorder: 0.0,
            reorder_delay_ns: 50_000,
            loss: 0.0,
            rto_ns: 200_000,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub seed: u64,
    /// Every link's model, except those in `links`.
    pub link: LinkModel,
    /// Links of their own (`from`, `to`, model): a slow or lossy pair.
    pub links: Vec<(usize, usize, LinkModel)>,
    /// Each rank starts its next collective after `[0, compute_jitter_ns)`,
    /// so peers run ahead into the next collective.
    pub compute_jitter_ns: u64,
    /// Give up (as a stall) past this virtual time.
    pub max_time_ns: u64,
    pub max_events: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            link: LinkModel::default(),
            links: Vec::new(),
            compute_jitter_ns: 20_000,
            max_time_ns: 3_600 * 1_000_000_000,
            max_events: 500_000_000,
        }
    }
}

impl SimConfig {
    /// The model of the link from `from` to `to`.
    pub fn link(&self, from: usize, to: usize) -> &LinkModel {
        self.links
            .iter()
            .find(|(f, t, _)| (*f, *t) == (from, to))
            .map_or(&self.link, |(_, _, m)| m)
    }

    /// A hostile network: jitter, heavy reordering and loss.
    pub fn lossy(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            link: LinkModel {
                latency_ns: 20_000,
                jitter_ns: 30_000,
                bytes_per_sec: 5_000_000_000,
                reorder: 0.3,
                reorder_delay_ns: 100_000,
                loss: 0.1,
                rto_ns: 150_000,
            },
            compute_jitter_ns: 80_000,
            ..SimConfig::default()
        }
    }
}

/// One collective for every rank: `bufs[r]` is rank `r`'s buffer, updated
/// in place.
#[derive(Debug, Clone)]
pub struct Job {
    pub collective: Collective,
    pub bufs: Vec<Vec<f32>>,
}

impl Job {
    pub fn new(collective: Collective, bufs: Vec<Vec<f32>>) -> Job {
        Job { collective, bufs }
    }
}

#[derive(Debug, Clone, Default)]
pub struct SimReport {
    /// Virtual time when the last rank finished its last job.
    pub time_ns: u64,
    pub events: u64,
    pub messages: u64,
    pub retransmissions: u64,
    /// `done_ns[r][j]`: when rank `r` finished job `j`.
    pub done_ns: Vec<Vec<u64>>,
    pub counters: Vec<Counters>,
}

enum Event {
    Start {
        rank: usize,
    },
    Deliver {
        from: usize,
        to: usize,
        bytes: Vec<u8>,
    },
}

/// Hook that may rewrite any message in flight (Byzantine peers).
pub type Tamper = Box<dyn FnMut(usize, usize, &mut Vec<u8>)>;

pub struct Sim {
    engines: Vec<Engine>,
    cfg: SimConfig,
    rng: u64,
    now: u64,
    tiebreak: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Event>>,
    free_slots: Vec<usize>,
    link_free_at: Vec<u64>,
    tamper: Option<Tamper>,
    report: SimReport,
}

impl Sim {
    pub fn new(world: usize, engine: Config, cfg: SimConfig) -> Result<Sim> {
        let links = std::iter::once(&cfg.link).chain(cfg.links.iter().map(|(_, _, m)| m));
        for m in links {
            if !(0.0..1.0).contains(&m.loss) || !(0.0..=1.0).contains(&m.reorder) {
                // A link that loses every transmission never delivers: the
                // retransmission loop would not end.
                return Err(Error::Config(
                    "a simulated link's loss must be in [0, 1) and its reorder probability in [0, 1]",
                ));
            }
        }
        let engines = (0..world)
            .map(|r| Engine::new(r, world, engine.clone()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Sim {
            engines,
            rng: cfg.seed ^ 0xA076_1D64_78BD_642F,
            cfg,
            now: 0,
            tiebreak: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            free_slots: Vec::new(),
            link_free_at: vec![0; world * world],
            tamper: None,
            report: SimReport::default(),
        })
    }

    pub fn engine(&self, rank: usize) -> &Engine {
        &self.engines[rank]
    }

    pub fn engine_mut(&mut self, rank: usize) -> &mut Engine {
        &mut self.engines[rank]
    }

    pub fn set_tamper(&mut self, tamper: Tamper) {
        self.tamper = Some(tamper);
    }

    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    fn schedule(&mut self, at: u64, ev: Event) {
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.events[s] = Some(ev);
                s
            }
            None => {
                self.events.push(Some(ev));
                self.events.len() - 1
            }
        };
        self.tiebreak += 1;
        self.queue.push(Reverse((at, self.tiebreak, slot)));
    }

    /// Moves everything `rank` queued onto the links.
    fn flush(&mut self, rank: usize) {
        let world = self.engines.len();
        while let Some(out) = self.engines[rank].poll_send() {
            let mut bytes = out.bytes;
            let to = out.to;
            let link = self.cfg.link(rank, to).clone();
            let tx = if link.bytes_per_sec == 0 {
                0
            } else {
                (bytes.len() as u128 * 1_000_000_000 / link.bytes_per_sec as u128) as u64
            };
            let li = rank * world + to;
            let depart = self.now.max(self.link_free_at[li]) + tx;
            self.link_free_at[li] = depart;
            let mut at = depart + link.latency_ns + self.below(link.jitter_ns);
            if self.chance(link.reorder) {
                at += self.below(link.reorder_delay_ns);
            }
            while self.chance(link.loss) {
                at += link.rto_ns;
                self.report.retransmissions += 1;
            }
            if let Some(t) = self.tamper.as_mut() {
                t(rank, to, &mut bytes);
            }
            self.report.messages += 1;
            self.schedule(
                at,
                Event::Deliver {
                    from: rank,
                    to,
                    bytes,
                },
            );
        }
    }

    /// Runs every job on every rank, in order; each rank moves to its next
    /// job as soon as it finishes one (plus compute jitter).
    pub fn run(&mut self, jobs: &mut [Job]) -> Result<SimReport> {
        let world = self.engines.len();
        if jobs.iter().any(|j| j.bufs.len() != world) {
            return Err(Error::Config("every job needs one buffer per rank"));
        }
        self.report = SimReport {
            done_ns: vec![Vec::new(); world],
            ..SimReport::default()
        };
        // A run that ended in an error left its events behind (a start
        // for every rank it had not reached): a new run begins with none.
        self.queue.clear();
        self.events.clear();
        self.free_slots.clear();
        let mut next_job = vec![0usize; world];
        if !jobs.is_empty() {
            for r in 0..world {
                let at = self.now + self.below(self.cfg.compute_jitter_ns);
                self.schedule(at, Event::Start { rank: r });
            }
        }
        let mut events = 0u64;
        while let Some(Reverse((at, _, slot))) = self.queue.pop() {
            let ev = self.events[slot].take().expect("scheduled event");
            self.free_slots.push(slot);
            self.now = at;
            events += 1;
            if at > self.cfg.max_time_ns || events > self.cfg.max_events {
                return Err(self.stall(&next_job, jobs.len(), "time or event limit reached"));
            }
            let (rank, res) = match ev {
                Event::Start { rank } => {
                    let j = next_job[rank];
                    let job = &mut jobs[j];
                    (
                        rank,
                        self.engines[rank].start(job.collective, &mut job.bufs[rank]),
                    )
                }
                Event::Deliver { from, to, bytes } => {
                    let j = next_job[to];
                    let res = match jobs.get_mut(j) {
                        Some(job) => self.engines[to].handle(from, &bytes, &mut job.bufs[to]),
                        None => self.engines[to].handle(from, &bytes, &mut []),
                    };
                    self.engines[from].recycle(bytes);
                    (to, res)
                }
            };
            let progress = res.map_err(|e| Error::SimRank {
                rank,
                source: Box::new(e),
            })?;
            if progress == Progress::Complete {
                self.report.done_ns[rank].push(self.now);
                next_job[rank] += 1;
                if next_job[rank] < jobs.len() {
                    let at = self.now + self.below(self.cfg.compute_jitter_ns);
                    self.schedule(at, Event::Start { rank });
                }
            }
            self.flush(rank);
        }
        if next_job.iter().any(|&j| j < jobs.len()) {
            return Err(self.stall(&next_job, jobs.len(), "no message in flight"));
        }
        self.report.events = events;
        self.report.time_ns = self.now;
        self.report.counters = self.engines.iter().map(|e| e.counters()).collect();
        Ok(std::mem::take(&mut self.report))
    }

    fn stall(&self, next_job: &[usize], jobs: usize, why: &str) -> Error {
        let waiting: Vec<String> = next_job
            .iter()
            .enumerate()
            .filter(|(_, &j)| j < jobs)
            .map(|(r, &j)| {
                let e = &self.engines[r];
                format!(
                    "rank {r} at job {j} (seq {}, {})",
                    e.seq(),
                    if e.is_active() {
                        "running"
                    } else {
                        "not started"
                    }
                )
            })
            .collect();
        Error::Stalled {
            time_ns: self.now,
            detail: format!("{why}; waiting: {}", waiting.join(", ")),
        }
    }
}
