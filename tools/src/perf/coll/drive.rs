//! How a measuring rank drives its lanes: from its own thread, inside the
//! calls, or through a progress thread (`--progress`), with the simulated
//! computation of `--overlap-us` placed where a training step has it.

use std::time::Duration;

use collectives::driver::{Background, Lanes};
use collectives::{bf16, Collective};

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
    /// collective on `bucket`. The caller-thread loop moves nothing while
    /// the caller computes, so there the collective runs after it; the
    /// progress thread runs it meanwhile.
    pub fn step(
        &mut self,
        collective: Collective,
        bucket: &mut Bucket,
        compute: Duration,
    ) -> Result<()> {
        match (self, bucket) {
            (RankDriver::Caller(lanes), bucket) => {
                compute_for(compute);
                match bucket {
                    Bucket::F32(buf) => lanes.run(collective, buf)?,
                    Bucket::Bf16(buf) => lanes.run_bf16(collective, buf)?,
                }
            }
            (RankDriver::Thread(bg), Bucket::F32(buf)) => {
                let pending = bg.start(collective, std::mem::take(buf));
                compute_for(compute);
                *buf = pending.wait()?;
            }
            (RankDriver::Thread(bg), Bucket::Bf16(buf)) => {
                let pending = bg.start_bf16(collective, std::mem::take(buf));
                compute_for(compute);
                *buf = pending.wait()?;
            }
        }
        Ok(())
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

/// A buffer of `--dtype`.
pub enum Bucket {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
}

impl Bucket {
    /// Overwrites the bucket with `input` (in the bucket's type).
    pub fn fill_from(&mut self, input: &[f32]) {
        match self {
            Bucket::F32(b) => b.copy_from_slice(input),
            Bucket::Bf16(b) => {
                for (x, &v) in b.iter_mut().zip(input) {
                    *x = bf16::from_f32(v);
                }
            }
        }
    }

    /// The elements as f32 (exact for both types).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            Bucket::F32(b) => b.clone(),
            Bucket::Bf16(b) => b.iter().map(|x| x.to_f32()).collect(),
        }
    }
}

fn compute_for(d: Duration) {
    if !d.is_zero() {
        std::thread::sleep(d);
    }
}
