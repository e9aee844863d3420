//! dpdk-ffi: bindings to the system DPDK (22.11 LTS, found with pkg-config)
//! and safe RAII types over them. All of ainftp's unsafe code for DPDK lives
//! here; the layers above see only safe types.
//!
//! ```no_run
//! use dpdk_ffi::{Eal, Mempool, MbufBatch, Port, PortConfig};
//! let eal = Eal::init(["-l", "0", "--no-pci", "--in-memory"]).unwrap();
//! let pool = Mempool::new(&eal, "rx", 8191, 256, dpdk_ffi::DEFAULT_DATA_ROOM, None).unwrap();
//! let port = Port::open(&eal, "net_null0", &PortConfig::default(), &pool).unwrap();
//! let (mut rx, mut tx) = (port.rx_queue(0).unwrap(), port.tx_queue(0).unwrap());
//! let mut burst = MbufBatch::<32>::new();
//! rx.rx_burst(&mut burst);
//! tx.tx_burst(&mut burst);
//! ```

#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    unsafe_op_in_unsafe_fn,
    clippy::all
)]
pub mod sys {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

mod batch;
mod eal;
mod error;
mod extmem;
pub mod hugepages;
pub mod lcore;
mod mbuf;
mod mempool;
mod port;
mod queue;
pub mod ring;

pub use batch::{Drain, MbufBatch};
pub use eal::Eal;
pub use error::{last_errno, strerror, Error, Result};
pub use extmem::{ExtMem, IovaMode, PinnedMemory};
pub use mbuf::{CsumStatus, Mbuf, RxChecksum};
pub use mempool::{data_room_for_frame, Mempool, DEFAULT_DATA_ROOM};
pub use port::{LinkStatus, Port, PortConfig, PortFeatures, PortInfo, PortStats};
pub use queue::{RxQueue, TxQueue};
pub use ring::Ring;
