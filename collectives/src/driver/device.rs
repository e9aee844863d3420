//! Reduced buckets to the GPU: all-reduce a step's buckets one after
//! another and copy each reduced bucket into device memory (gpudirect's
//! double-buffered [`DeviceMirror`]) while the next bucket is on the wire.
//!
//! The copy of bucket k is issued asynchronously right after its
//! all-reduce, so the DMA engine moves it while this thread runs bucket
//! k+1's network phase; bucket k is handed to the caller (with the CUDA
//! event that marks the copy done, for a compute stream to wait on) after
//! that phase. Without a GPU the mirror is host memory and the copies are
//! memcpy: same calls, same results.
//!
//! Buckets are best allocated in a gpudirect arena registered with CUDA
//! (page-locked), so the copies are true DMA from them. The other
//! direction, device gradients into the arena before sending, is
//! [`DeviceMirror::download`].

use gpudirect::cudarc::driver::CudaEvent;
use gpudirect::{DeviceMirror, Gpu, Transfer};

use super::backend::Backend;
use super::communicator::Communicator;
use crate::error::{Error, Result};
use crate::ReduceOp;

/// A reduced bucket on its way to the device, handed to the caller.
pub struct OnDevice<'a> {
    /// Position of the bucket in the step.
    pub index: usize,
    /// The mirror's slot that holds it ([`DeviceMirror::device`], or
    /// [`DeviceMirror::host`] when host-only).
    pub slot: usize,
    pub bytes: usize,
    /// Recorded after the copy on the mirror's stream (None host-only,
    /// where the copy is done already).
    pub event: Option<&'a CudaEvent>,
    pub mirror: &'a DeviceMirror,
}

/// What went through the pipeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    pub buckets: u64,
    pub bytes_copied: u64,
}

pub struct DevicePipeline {
    mirror: DeviceMirror,
    counters: DeviceCounters,
}

fn device_err(e: gpudirect::Error) -> Error {
    Error::Device(e.to_string())
}

impl DevicePipeline {
    /// Device buffers for buckets of up to `max_bucket_bytes` (host
    /// buffers when `gpu` is host-only).
    pub fn new(gpu: &Gpu, max_bucket_bytes: usize) -> Result<DevicePipeline> {
        Ok(DevicePipeline {
            mirror: DeviceMirror::new(gpu, max_bucket_bytes).map_err(device_err)?,
            counters: DeviceCounters::default(),
        })
    }

    pub fn mirror(&mut self) -> &mut DeviceMirror {
        &mut self.mirror
    }

    pub fn is_host_only(&self) -> bool {
        self.mirror.is_host_only()
    }

    pub fn counters(&self) -> DeviceCounters {
        self.counters
    }

    /// All-reduces `buckets` in order over `comm`, each one copied to the
    /// device once reduced. `consume` gets every bucket, in order, once
    /// its copy is issued; it returns the event after which the bucket's
    /// device buffer may be overwritten (None: right away), e.g. that of
    /// the kernel that reads it.
    pub fn all_reduce<B: Backend>(
        &mut self,
        comm: &mut Communicator<B>,
        buckets: &mut [&mut [f32]],
        op: ReduceOp,
        mut consume: impl FnMut(OnDevice<'_>) -> Option<CudaEvent>,
    ) -> Result<()> {
        if let Some(big) = buckets
            .iter()
            .find(|b| b.len() * 4 > self.mirror.capacity())
        {
            return Err(Error::Device(format!(
                "a {}-byte bucket does not fit the pipeline's {}-byte device buffers",
                big.len() * 4,
                self.mirror.capacity()
            )));
        }
        let mut in_flight: Option<(usize, Transfer<'_>)> = None;
        for (k, bucket) in buckets.iter_mut().enumerate() {
            // The network phase of bucket k overlaps the copy of k-1.
            comm.all_reduce(bucket, op)?;
            if let Some((j, t)) = in_flight.take() {
                self.deliver(j, t, &mut consume)?;
            }
            let bytes: &[u8] = bytemuck::cast_slice(bucket);
            in_flight = Some((k, self.mirror.upload(bytes).map_err(device_err)?));
        }
        if let Some((j, t)) = in_flight {
            self.deliver(j, t, &mut consume)?;
        }
        Ok(())
    }

    fn deliver(
        &mut self,
        index: usize,
        copy: Transfer<'_>,
        consume: &mut impl FnMut(OnDevice<'_>) -> Option<CudaEvent>,
    ) -> Result<()> {
        let (slot, bytes) = (copy.slot(), copy.len());
        let reuse_after = consume(OnDevice {
            index,
            slot,
            bytes,
            event: copy.event(),
            mirror: &self.mirror,
        });
        // Usually done by now (a whole network phase later); the source
        // bucket is the caller's again once it is.
        copy.wait().map_err(device_err)?;
        self.counters.buckets += 1;
        self.counters.bytes_copied += bytes as u64;
        self.mirror.release(slot, reuse_after).map_err(device_err)
    }
}
