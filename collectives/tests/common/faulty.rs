//! A kernel UDP backend for the driver's tests that loses or breaks on
//! purpose.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stack::io::kernel::KernelUdp;

/// Kernel UDP with faults put in on purpose: it loses its first
/// `lose_small` datagrams of under 100 bytes (past the padded handshake:
/// the hello that names the dialling rank, acknowledgements), panics
/// once when its sends pass `panic_after` (a bug in a lane), and loses
/// every datagram once `cut` is set (a path that went dark).
pub struct Faulty {
    pub inner: KernelUdp,
    pub lose_small: usize,
    pub panic_after: Option<usize>,
    pub cut: Arc<AtomicBool>,
    sent: usize,
}

impl Faulty {
    pub fn new(inner: KernelUdp) -> Faulty {
        Faulty {
            inner,
            lose_small: 0,
            panic_after: None,
            cut: Arc::new(AtomicBool::new(false)),
            sent: 0,
        }
    }
}

impl stack::io::PacketIo for Faulty {
    type Buf = <KernelUdp as stack::io::PacketIo>::Buf;

    fn recv_burst(&mut self, out: &mut Vec<Self::Buf>, max: usize) -> usize {
        self.inner.recv_burst(out, max)
    }

    fn alloc(&mut self) -> Option<Self::Buf> {
        self.inner.alloc()
    }

    fn release(&mut self, buf: Self::Buf) {
        self.inner.release(buf)
    }

    fn send_burst(&mut self, bufs: &mut Vec<Self::Buf>) -> usize {
        self.sent += bufs.len();
        if self.panic_after.is_some_and(|n| self.sent > n) {
            self.panic_after = None;
            panic!("lane panics on purpose");
        }
        let mut lost = 0;
        let mut keep = Vec::with_capacity(bufs.len());
        let cut = self.cut.load(Ordering::Relaxed);
        for b in bufs.drain(..) {
            if cut {
                lost += 1;
                self.inner.release(b);
            } else if self.lose_small > 0 && stack::io::Datagram::payload(&b).len() < 100 {
                self.lose_small -= 1;
                lost += 1;
                self.inner.release(b);
            } else {
                keep.push(b);
            }
        }
        *bufs = keep;
        lost + self.inner.send_burst(bufs)
    }

    fn poll(&mut self, now: Instant) {
        self.inner.poll(now)
    }

    fn local_ip(&self) -> std::net::Ipv4Addr {
        self.inner.local_ip()
    }

    fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }
}

impl collectives::driver::Backend for Faulty {
    fn wait(&mut self, writable: bool, timeout: Duration) -> collectives::Result<()> {
        collectives::driver::Backend::wait(&mut self.inner, writable, timeout)
    }

    fn local_port(&self) -> u16 {
        self.inner.local_addr().port()
    }
}
