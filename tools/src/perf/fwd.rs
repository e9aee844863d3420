//! The forwarding loops, one per lcore, each owning a set of streams (an rx
//! queue and/or a tx queue). Like testpmd's io engine: burst in, burst out,
//! drop what the tx queue refuses.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use dpdk_ffi::{MbufBatch, Mempool, RxQueue, TxQueue};

use stack::runtime::Backoff;

use super::args::{IdlePolicy, Mode};

pub const MAX_BURST: usize = 512;

/// Packets each port's tx queues refused (and we freed), per port.
pub type DropCounters = Arc<Vec<CachePadded<AtomicU64>>>;

pub struct Stream {
    pub rx: Option<RxQueue>,
    pub tx: Option<TxQueue>,
    /// Index (into the port list) of the port `tx` belongs to.
    pub tx_port: usize,
    /// The frame txonly (and --tx-first) sends.
    pub template: Vec<u8>,
    batch: MbufBatch<MAX_BURST>,
}

impl Stream {
    pub fn new(
        rx: Option<RxQueue>,
        tx: Option<TxQueue>,
        tx_port: usize,
        template: Vec<u8>,
    ) -> Self {
        Stream {
            rx,
            tx,
            tx_port,
            template,
            batch: MbufBatch::new(),
        }
    }
}

pub struct Engine {
    pub mode: Mode,
    pub burst: usize,
    pub idle: IdlePolicy,
    /// Seed each stream with one burst before forwarding.
    pub tx_first: bool,
    pub pool: Mempool,
    pub stop: Arc<AtomicBool>,
    pub drops: DropCounters,
}

/// Run the streams until `stop` is set. Returns nothing: the counters are
/// the port statistics and `drops`.
pub fn run(engine: &Engine, mut streams: Vec<Stream>) {
    let mut backoff = Backoff::new(engine.idle.into());
    if engine.tx_first {
        for s in streams.iter_mut() {
            // Poll first: some PMDs (memif) hand their rx ring to the peer
            // only on the first rx burst, and the peer would drop our seed
            // packets' replies before that.
            forward(engine, s, engine.mode == Mode::Macswap);
            send_burst(engine, s);
        }
    }
    while !engine.stop.load(Ordering::Relaxed) {
        let mut moved = 0;
        for s in streams.iter_mut() {
            moved += match engine.mode {
                Mode::Io => forward(engine, s, false),
                Mode::Macswap => forward(engine, s, true),
                Mode::Rxonly => receive(engine, s),
                Mode::Txonly => send_burst(engine, s),
                Mode::UdpEcho
                | Mode::UdpPingpong
                | Mode::Allreduce
                | Mode::ReduceScatter
                | Mode::Allgather
                | Mode::Broadcast => {
                    unreachable!("validate() keeps socket modes out")
                }
            };
        }
        backoff.after_poll(moved);
    }
}

#[inline]
fn forward(engine: &Engine, s: &mut Stream, swap_macs: bool) -> usize {
    let (Some(rx), Some(tx)) = (s.rx.as_mut(), s.tx.as_mut()) else {
        return 0;
    };
    let n = rx.rx_burst_max(&mut s.batch, engine.burst);
    if n == 0 {
        return 0;
    }
    if swap_macs {
        for m in s.batch.iter_mut() {
            let d = m.data_mut();
            if d.len() >= 12 {
                let (dst, src) = d.split_at_mut(6);
                dst.swap_with_slice(&mut src[..6]);
            }
        }
    }
    tx.tx_burst(&mut s.batch);
    drop_unsent(engine, s);
    n
}

#[inline]
fn receive(engine: &Engine, s: &mut Stream) -> usize {
    let Some(rx) = s.rx.as_mut() else { return 0 };
    let n = rx.rx_burst_max(&mut s.batch, engine.burst);
    s.batch.clear();
    n
}

/// One burst of the stream's template frame (txonly, and --tx-first).
#[inline]
pub fn send_burst(engine: &Engine, s: &mut Stream) -> usize {
    let Some(tx) = s.tx.as_mut() else { return 0 };
    if engine.pool.alloc_bulk(&mut s.batch, engine.burst).is_err() {
        return 0; // pool empty for now: the NIC still holds sent mbufs
    }
    for m in s.batch.iter_mut() {
        // The pool's data room fits --pkt-size (checked at start).
        if let Ok(room) = m.append(s.template.len()) {
            room.copy_from_slice(&s.template);
        }
    }
    let sent = tx.tx_burst(&mut s.batch);
    drop_unsent(engine, s);
    sent
}

#[inline]
fn drop_unsent(engine: &Engine, s: &mut Stream) {
    if !s.batch.is_empty() {
        engine.drops[s.tx_port].fetch_add(s.batch.len() as u64, Ordering::Relaxed);
        s.batch.clear();
    }
}
