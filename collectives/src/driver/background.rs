//! A communicator on a thread of its own, so that collectives progress
//! while the caller computes.
//!
//! [`Communicator`] runs its loop in the caller's thread, inside the calls:
//! between `start` and `wait` nothing moves unless the caller polls with
//! `test`. A training step wants the opposite: hand bucket k to the
//! network, go on with the backward pass, and be woken once bucket k is
//! reduced. [`Background`] moves a communicator (or a rank's [`Lanes`])
//! onto a thread, pinned to a CPU if asked, that runs the collectives in
//! the order they were started; the caller's [`Pending`] is woken once
//! per bucket, when its result is in.
//!
//! ```text
//! let mut bg = Background::spawn(Communicator::from_env(cfg)?, Some(3))?;
//! let p = bg.start(Collective::all_reduce(ReduceOp::Sum), bucket);
//! backward_pass_of_the_next_layer();          // the bucket is on the wire
//! let bucket = p.wait()?;                     // reduced
//! ```
//!
//! The price is a thread hand-off each way (two wake-ups, some
//! microseconds): for small latency-bound collectives the caller-thread
//! API is faster. Between collectives the thread moves the mesh's traffic
//! every [`IDLE_TICK`] (acknowledgements, retransmissions, a peer's early
//! messages) and otherwise sleeps on its request queue.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use super::communicator::{Communicator, DriverCounters};
use super::lanes::Lanes;
use super::Backend;
use crate::error::{Error, Result};
use crate::{bf16, Collective, ReduceOp};

/// How often an idle progress thread moves the mesh's traffic.
pub const IDLE_TICK: Duration = Duration::from_millis(2);

/// What a progress thread can drive: a [`Communicator`] or a rank's
/// [`Lanes`].
pub trait Collectives: Send + 'static {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    /// Runs `collective` on `buf` to completion.
    fn run(&mut self, collective: Collective, buf: &mut [f32]) -> Result<()>;
    /// The same on bf16 (reduced in f32, see [`crate::dtype`]).
    fn run_bf16(&mut self, collective: Collective, buf: &mut [bf16]) -> Result<()>;
    /// Moves traffic without waiting.
    fn progress_now(&mut self) -> Result<()>;
    fn counters(&self) -> DriverCounters;
    /// Leaves the mesh cleanly.
    fn shutdown(self) -> Result<()>;
}

impl<B: Backend + Send + 'static> Collectives for Communicator<B>
where
    B::Buf: Send,
{
    fn rank(&self) -> usize {
        Communicator::rank(self)
    }
    fn world(&self) -> usize {
        Communicator::world(self)
    }
    fn run(&mut self, collective: Collective, buf: &mut [f32]) -> Result<()> {
        Communicator::run(self, collective, buf)
    }
    fn run_bf16(&mut self, collective: Collective, buf: &mut [bf16]) -> Result<()> {
        Communicator::run_bf16(self, collective, buf)
    }
    fn progress_now(&mut self) -> Result<()> {
        self.progress(Duration::ZERO)
    }
    fn counters(&self) -> DriverCounters {
        Communicator::counters(self)
    }
    fn shutdown(self) -> Result<()> {
        Communicator::shutdown(self)
    }
}

impl<B: Backend + Send + 'static> Collectives for Lanes<B>
where
    B::Buf: Send,
{
    fn rank(&self) -> usize {
        Lanes::rank(self)
    }
    fn world(&self) -> usize {
        Lanes::world(self)
    }
    fn run(&mut self, collective: Collective, buf: &mut [f32]) -> Result<()> {
        Lanes::run(self, collective, buf)
    }
    fn run_bf16(&mut self, collective: Collective, buf: &mut [bf16]) -> Result<()> {
        Lanes::run_bf16(self, collective, buf)
    }
    fn progress_now(&mut self) -> Result<()> {
        self.progress()
    }
    fn counters(&self) -> DriverCounters {
        Lanes::counters(self)
    }
    fn shutdown(self) -> Result<()> {
        Lanes::shutdown(self)
    }
}

/// Runs on the progress thread with the communicator in hand.
type Request<C> = Box<dyn FnOnce(&mut C) + Send>;

/// Collectives run by a thread of their own. Dropping it (or
/// [`Background::shutdown`]) runs every collective already started, then
/// leaves the mesh as the communicator's own shutdown does.
pub struct Background<C: Collectives> {
    requests: Option<Sender<Request<C>>>,
    thread: Option<JoinHandle<Result<()>>>,
    rank: usize,
    world: usize,
}

impl<C: Collectives> Background<C> {
    /// Moves `comm` onto a new thread, pinned to `cpu` when given (a CPU
    /// that cannot be had is a warning, not an error: the thread runs
    /// unpinned).
    pub fn spawn(comm: C, cpu: Option<usize>) -> Result<Self> {
        let (rank, world) = (comm.rank(), comm.world());
        let (requests, queue) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name(format!("ainftp-progress-{rank}"))
            .spawn(move || {
                if let Some(id) = cpu {
                    if !core_affinity::set_for_current(core_affinity::CoreId { id }) {
                        tracing::warn!(rank, cpu = id, "could not pin the progress thread");
                    }
                }
                serve(comm, queue)
            })
            .map_err(|e| Error::Transport(format!("cannot start the progress thread: {e}")))?;
        Ok(Background {
            requests: Some(requests),
            thread: Some(thread),
            rank,
            world,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// Queues `collective` on `buf` (owned until the [`Pending`] gives it
    /// back with the result; a collective that fails keeps it). Collectives
    /// run in the order started, one at a time; every rank must start the
    /// same ones in the same order.
    pub fn start(&mut self, collective: Collective, buf: Vec<f32>) -> Pending {
        self.queue(buf, move |c, buf| c.run(collective, buf))
    }

    /// `start` on bf16 (reduced in f32, see [`crate::dtype`]).
    pub fn start_bf16(&mut self, collective: Collective, buf: Vec<bf16>) -> Pending<bf16> {
        self.queue(buf, move |c, buf| c.run_bf16(collective, buf))
    }

    fn queue<T: Send + 'static>(
        &mut self,
        mut buf: Vec<T>,
        run: impl FnOnce(&mut C, &mut [T]) -> Result<()> + Send + 'static,
    ) -> Pending<T> {
        let (done, result) = crossbeam_channel::bounded(1);
        let request: Request<C> = Box::new(move |c| {
            let r = run(c, &mut buf).map(|()| buf);
            // The caller may have dropped its Pending: nothing to tell.
            let _ = done.send(r);
        });
        match self.send(request) {
            Ok(()) => Pending {
                result,
                ready: None,
            },
            Err(e) => Pending {
                result,
                ready: Some(Err(e)),
            },
        }
    }

    /// Runs `collective` and waits for it: `start` then `wait`.
    pub fn run(&mut self, collective: Collective, buf: Vec<f32>) -> Result<Vec<f32>> {
        self.start(collective, buf).wait()
    }

    pub fn all_reduce(&mut self, buf: Vec<f32>, op: ReduceOp) -> Result<Vec<f32>> {
        self.run(Collective::all_reduce(op), buf)
    }

    pub fn barrier(&mut self) -> Result<()> {
        self.run(Collective::barrier(), Vec::new()).map(drop)
    }

    /// The communicator's counters, read by its thread once the running
    /// collective (if any) is done. `wakeups` counts collectives completed.
    pub fn counters(&self) -> Result<DriverCounters> {
        self.with(|c| c.counters())
    }

    /// Calls `f` on the progress thread with the communicator, once the
    /// collectives started before are done, and returns what it returns.
    pub fn with<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut C) -> R + Send + 'static,
    ) -> Result<R> {
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.send(Box::new(move |c: &mut C| {
            let _ = reply.send(f(c));
        }))?;
        answer.recv().map_err(|_| gone())
    }

    /// Runs what was started, then leaves the mesh; the communicator's
    /// shutdown error, if any.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop()
    }

    fn send(&self, request: Request<C>) -> Result<()> {
        let requests = self.requests.as_ref().expect("open until dropped");
        requests.send(request).map_err(|_| gone())
    }

    fn stop(&mut self) -> Result<()> {
        // A closed queue tells the thread to finish what is queued and leave.
        self.requests = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(Error::ProgressThread("panicked")),
            None => Ok(()),
        }
    }
}

impl<C: Collectives> Drop for Background<C> {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// A collective started with [`Background::start`] (or `start_bf16`).
#[must_use = "wait for the collective to get its buffer back"]
pub struct Pending<T = f32> {
    result: Receiver<Result<Vec<T>>>,
    ready: Option<Result<Vec<T>>>,
}

impl<T> Pending<T> {
    /// Whether the result is in; never blocks and moves nothing (the
    /// progress thread does that).
    pub fn test(&mut self) -> bool {
        if self.ready.is_none() {
            match self.result.try_recv() {
                Ok(r) => self.ready = Some(r),
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => self.ready = Some(Err(gone())),
            }
        }
        self.ready.is_some()
    }

    /// Sleeps until the collective is done; its buffer (the result).
    pub fn wait(self) -> Result<Vec<T>> {
        match self.ready {
            Some(r) => r,
            None => self.result.recv().unwrap_or_else(|_| Err(gone())),
        }
    }
}

/// The thread ended without answering: only a panic does that.
fn gone() -> Error {
    Error::ProgressThread("ended (it panicked) before answering")
}

/// The progress thread: runs requests as they come, moves traffic every
/// `IDLE_TICK` between them, and leaves once the queue is closed and empty.
fn serve<C: Collectives>(mut comm: C, queue: Receiver<Request<C>>) -> Result<()> {
    // A deadline, not a timeout per wait: requests that come more often
    // than the tick (counters, say) do not hold the traffic back.
    let mut next_tick = Instant::now() + IDLE_TICK;
    loop {
        match queue.recv_deadline(next_tick) {
            Ok(request) => request(&mut comm),
            // A failure here (a peer's connection closed while idle)
            // leaves the communicator failed: the next collective says why.
            Err(RecvTimeoutError::Timeout) => {
                drop(comm.progress_now());
                next_tick = Instant::now() + IDLE_TICK;
            }
            Err(RecvTimeoutError::Disconnected) => return comm.shutdown(),
        }
    }
}
