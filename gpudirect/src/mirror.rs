//! Double-buffered copies of reduced buckets between the host arena and the
//! device: bucket k+1 is copied into one device buffer while the GPU still
//! works on bucket k in the other. Host-only mode keeps the same API with
//! host buffers and memcpy, so callers need no branch.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{
    result, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
};
use memmap2::MmapMut;

use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// The device buffers alternate between two slots.
pub const SLOTS: usize = 2;

pub struct DeviceMirror {
    capacity: usize,
    next: usize,
    slots: [Slot; SLOTS],
    backend: Backend,
}

#[derive(Default)]
struct Slot {
    /// Uploaded into and not yet released by its user.
    in_use: bool,
    /// The user's "done with it" event: the next copy into the slot waits
    /// for it on the copy stream (not on the CPU).
    reuse_after: Option<CudaEvent>,
}

enum Backend {
    Host([MmapMut; SLOTS]),
    Cuda {
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        bufs: [CudaSlice<u8>; SLOTS],
    },
}

/// One copy in flight. Waits for it when dropped, so the host buffer it
/// borrows stays valid until the DMA has finished.
#[must_use = "dropping a Transfer waits for it; keep it to overlap the copy with other work"]
pub struct Transfer<'a> {
    slot: usize,
    len: usize,
    event: Option<CudaEvent>,
    _host: PhantomData<&'a mut ()>,
}

impl Transfer<'_> {
    /// The device buffer slot the copy went to or came from.
    pub fn slot(&self) -> usize {
        self.slot
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The CUDA event recorded after the copy (None when host-only, where
    /// copies are done when issued): make a compute stream wait on it.
    pub fn event(&self) -> Option<&CudaEvent> {
        self.event.as_ref()
    }

    pub fn is_done(&self) -> bool {
        self.event.as_ref().is_none_or(|e| e.is_complete())
    }

    /// Block until the copy has finished; returns the slot.
    pub fn wait(mut self) -> Result<usize> {
        if let Some(e) = self.event.take() {
            e.synchronize()?;
        }
        Ok(self.slot)
    }
}

impl Drop for Transfer<'_> {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            if let Err(err) = e.synchronize() {
                tracing::warn!(error = %err, "waiting for a dropped transfer failed");
            }
        }
    }
}

impl DeviceMirror {
    /// Two device buffers of `capacity` bytes each, and a copy stream of
    /// its own (or two host buffers when `gpu` is host-only).
    pub fn new(gpu: &Gpu, capacity: usize) -> Result<DeviceMirror> {
        if capacity == 0 {
            return Err(Error::InvalidArgument("a zero-capacity mirror".into()));
        }
        let backend = match gpu.context() {
            None => {
                let buf = || {
                    MmapMut::map_anon(capacity).map_err(|source| Error::Map {
                        len: capacity,
                        source,
                    })
                };
                Backend::Host([buf()?, buf()?])
            }
            Some(ctx) => {
                let stream = ctx.new_stream()?;
                let bufs = [
                    stream.alloc_zeros::<u8>(capacity)?,
                    stream.alloc_zeros::<u8>(capacity)?,
                ];
                Backend::Cuda {
                    ctx: ctx.clone(),
                    stream,
                    bufs,
                }
            }
        };
        Ok(DeviceMirror {
            capacity,
            next: 0,
            slots: Default::default(),
            backend,
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn is_host_only(&self) -> bool {
        matches!(self.backend, Backend::Host(_))
    }

    /// The slot the next upload goes to.
    pub fn next_slot(&self) -> usize {
        self.next
    }

    /// The copy stream (None when host-only).
    pub fn stream(&self) -> Option<&Arc<CudaStream>> {
        match &self.backend {
            Backend::Cuda { stream, .. } => Some(stream),
            Backend::Host(_) => None,
        }
    }

    /// Slot `slot`'s device buffer (None when host-only).
    pub fn device(&self, slot: usize) -> Option<&CudaSlice<u8>> {
        match &self.backend {
            Backend::Cuda { bufs, .. } => bufs.get(slot),
            Backend::Host(_) => None,
        }
    }

    /// Slot `slot`'s buffer in host-only mode (None with a GPU).
    pub fn host(&self, slot: usize) -> Option<&[u8]> {
        match &self.backend {
            Backend::Host(bufs) => bufs.get(slot).map(|b| &b[..]),
            Backend::Cuda { .. } => None,
        }
    }

    pub fn host_mut(&mut self, slot: usize) -> Option<&mut [u8]> {
        match &mut self.backend {
            Backend::Host(bufs) => bufs.get_mut(slot).map(|b| &mut b[..]),
            Backend::Cuda { .. } => None,
        }
    }

    /// Copy `src` (a bucket, ideally in a CUDA-registered arena) into the
    /// next slot's buffer, asynchronously. The slot must have been released
    /// since its last upload.
    pub fn upload<'a>(&mut self, src: &'a [u8]) -> Result<Transfer<'a>> {
        self.check_len(src.len())?;
        let slot = self.next;
        if self.slots[slot].in_use {
            return Err(Error::SlotBusy(slot));
        }
        let reuse_after = self.slots[slot].reuse_after.take();
        let event = match &mut self.backend {
            Backend::Host(bufs) => {
                bufs[slot][..src.len()].copy_from_slice(src);
                None
            }
            Backend::Cuda { ctx, stream, bufs } => {
                if let Some(e) = &reuse_after {
                    stream.wait(e)?;
                }
                let (dptr, _record) = bufs[slot].device_ptr_mut(stream);
                // SAFETY: dptr has capacity >= src.len() bytes; the returned
                // Transfer borrows src until the event says the copy is done.
                unsafe { result::memcpy_htod_async(dptr, src, stream.cu_stream()) }?;
                drop(_record);
                let done = ctx.new_event(None)?;
                done.record(stream)?;
                Some(done)
            }
        };
        self.slots[slot].in_use = true;
        self.next = (slot + 1) % SLOTS;
        Ok(Transfer {
            slot,
            len: src.len(),
            event,
            _host: PhantomData,
        })
    }

    /// The user of `slot` is done with it once `after` completes (None:
    /// already done); the next upload into it waits for that on the GPU.
    pub fn release(&mut self, slot: usize, after: Option<CudaEvent>) -> Result<()> {
        let s = self
            .slots
            .get_mut(slot)
            .ok_or_else(|| Error::InvalidArgument(format!("slot {slot} of {SLOTS}")))?;
        s.in_use = false;
        s.reuse_after = after;
        Ok(())
    }

    /// Copy the first `dst.len()` bytes of `slot`'s buffer back into `dst`
    /// (the arena), asynchronously, after `after` (the event of the kernel
    /// that produced them) when given.
    pub fn download<'a>(
        &mut self,
        slot: usize,
        dst: &'a mut [u8],
        after: Option<&CudaEvent>,
    ) -> Result<Transfer<'a>> {
        self.check_len(dst.len())?;
        if slot >= SLOTS {
            return Err(Error::InvalidArgument(format!("slot {slot} of {SLOTS}")));
        }
        let len = dst.len();
        let event = match &mut self.backend {
            Backend::Host(bufs) => {
                dst.copy_from_slice(&bufs[slot][..len]);
                None
            }
            Backend::Cuda { ctx, stream, bufs } => {
                if let Some(e) = after {
                    stream.wait(e)?;
                }
                let (dptr, _record) = bufs[slot].device_ptr(stream);
                // SAFETY: the buffer holds >= len bytes; the Transfer
                // borrows dst until the copy is done.
                unsafe { result::memcpy_dtoh_async(dst, dptr, stream.cu_stream()) }?;
                drop(_record);
                let done = ctx.new_event(None)?;
                done.record(stream)?;
                Some(done)
            }
        };
        Ok(Transfer {
            slot,
            len,
            event,
            _host: PhantomData,
        })
    }

    fn check_len(&self, len: usize) -> Result<()> {
        if len > self.capacity {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes do not fit the mirror's {}-byte buffers: create it with a larger capacity",
                self.capacity
            )));
        }
        Ok(())
    }
}
