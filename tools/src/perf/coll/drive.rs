//! How a measuring rank drives its lanes: from its own thread, inside the
//! calls, or through a progress thread (`--progress`), with the simulated
//! computation of `--overlap-us` placed where a training step has it.

use std::time::Duration;

use collectives::driver::{Background, Lanes};
use collectives::{Collective, ReduceOp};

use super::LaneBackend;
use crate::error::Result;

pub enum RankDriver<B: LaneBackend>
where
    B::Buf: Send,
{
    /// The caller's thread runs each collective inside the call.
    Caller(Lanes<B>),
    /// A progress thread runs them; the caller is woken once per bucket.
    Thread(Background<Lanes<B>>),
}

impl<B: LaneBackend> RankDriver<B>
where
    B::Buf: Send,
{
    /// One training step's worth: `compute` of work (a sleep) and the
    /// collective on `buf`. The caller-thread loop moves nothing while the
    /// caller computes, so there the collective runs after it; the
    /// progress thread runs it meanwhile.
    pub fn step(
        &mut self,
        collective: Collective,
        buf: &mut Vec<f32>,
        compute: Duration,
    ) -> Result<()> {
        match self {
            RankDriver::Caller(lanes) => {
                compute_for(compute);
                lanes.run(collective, buf)?;
            }
            RankDriver::Thread(bg) => {
                let pending = bg.start(collective, std::mem::take(buf));
                compute_for(compute);
                *buf = pending.wait()?;
            }
        }
        Ok(())
    }

    pub fn all_reduce(&mut self, buf: &mut Vec<f32>, op: ReduceOp) -> Result<()> {
        self.step(Collective::all_reduce(op), buf, Duration::ZERO)
    }

    /// `f` on the lanes, wherever they run.
    pub fn inspect<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Lanes<B>) -> R + Send + 'static,
    ) -> Result<R> {
        Ok(match self {
            RankDriver::Caller(lanes) => f(lanes),
            RankDriver::Thread(bg) => bg.with(move |lanes| f(lanes))?,
        })
    }

    pub fn shutdown(self) -> Result<()> {
        match self {
            RankDriver::Caller(lanes) => lanes.shutdown()?,
            RankDriver::Thread(bg) => bg.shutdown()?,
        }
        Ok(())
    }
}

fn compute_for(d: Duration) {
    if !d.is_zero() {
        std::thread::sleep(d);
    }
}
