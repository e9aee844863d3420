//! Receive and transmit queues, each owned by one lcore, moving bursts of
//! mbufs in and out of an `MbufBatch`.

use crate::batch::MbufBatch;
use crate::port::Port;
use crate::sys;

pub struct RxQueue {
    port_id: u16,
    queue: u16,
    port: Port,
}

pub struct TxQueue {
    port_id: u16,
    queue: u16,
    port: Port,
}

impl Drop for RxQueue {
    fn drop(&mut self) {
        self.port.give_back(true, self.queue);
    }
}

impl Drop for TxQueue {
    fn drop(&mut self) {
        self.port.give_back(false, self.queue);
    }
}

impl RxQueue {
    pub(crate) fn new(port: Port, queue: u16) -> Self {
        RxQueue {
            port_id: port.id(),
            queue,
            port,
        }
    }

    pub fn port_id(&self) -> u16 {
        self.port_id
    }

    pub fn queue_id(&self) -> u16 {
        self.queue
    }

    /// Receive into the batch's free slots; returns how many arrived.
    #[inline]
    pub fn rx_burst<const N: usize>(&mut self, batch: &mut MbufBatch<N>) -> usize {
        self.rx_burst_max(batch, N)
    }

    /// Receive at most `max` packets into the batch's free slots.
    #[inline]
    pub fn rx_burst_max<const N: usize>(&mut self, batch: &mut MbufBatch<N>, max: usize) -> usize {
        let room = batch.spare().min(max).min(u16::MAX as usize) as u16;
        // SAFETY: this queue is configured (the Port lives in self; a
        // stopped port's bursts move nothing) and owned by this thread
        // (&mut self; one holder per queue, and no stop or start while held); the batch
        // has `room` free slots for the received pointers.
        unsafe {
            let n =
                sys::ainftp_rx_burst(self.port_id, self.queue, batch.spare_ptr(), room) as usize;
            batch.commit(n);
            n
        }
    }
}

impl TxQueue {
    pub(crate) fn new(port: Port, queue: u16) -> Self {
        TxQueue {
            port_id: port.id(),
            queue,
            port,
        }
    }

    pub fn port_id(&self) -> u16 {
        self.port_id
    }

    pub fn queue_id(&self) -> u16 {
        self.queue
    }

    /// Send from the front of the batch; returns how many the PMD took.
    /// Unsent mbufs stay in the batch (moved to the front) for the caller to
    /// retry or drop: nothing is leaked either way.
    #[inline]
    pub fn tx_burst<const N: usize>(&mut self, batch: &mut MbufBatch<N>) -> usize {
        if batch.is_empty() {
            return 0;
        }
        // SAFETY: the queue is configured and exclusively ours (one holder,
        // no stop or start while held); the batch's
        // first len slots are owned mbufs, and the PMD takes ownership of
        // the first `sent`, which we then remove from the batch.
        let sent = unsafe {
            sys::ainftp_tx_burst(
                self.port_id,
                self.queue,
                batch.as_mut_ptr(),
                batch.len() as u16,
            )
        } as usize;
        if sent > 0 {
            batch.consume_front(sent);
        }
        sent
    }
}
