//! Mbuf and mempool lifecycle: counts return to baseline, editing works.

mod common;

use dpdk_ffi::{Error, MbufBatch};

#[test]
fn alloc_and_drop_returns_every_mbuf_to_the_pool() {
    let pool = common::pool("mb_alloc", 1023);
    assert_eq!(pool.in_use(), 0);
    let held: Vec<_> = (0..100).map(|_| pool.alloc().unwrap()).collect();
    assert_eq!(pool.in_use(), 100);
    assert_eq!(pool.available(), 1023 - 100);
    drop(held);
    assert_eq!(pool.in_use(), 0);

    let mut batch = MbufBatch::<32>::new();
    pool.alloc_bulk(&mut batch, 32).unwrap();
    assert_eq!(batch.len(), 32);
    assert_eq!(pool.in_use(), 32);
    batch.truncate(10);
    assert_eq!(pool.in_use(), 10);
    drop(batch);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn an_exhausted_pool_says_so_and_recovers() {
    let pool = common::pool("mb_exhaust", 63);
    let all: Vec<_> = (0..63).map(|_| pool.alloc().unwrap()).collect();
    assert!(matches!(pool.alloc(), Err(Error::PoolExhausted(_))));
    let mut batch = MbufBatch::<4>::new();
    assert!(pool.alloc_bulk(&mut batch, 4).is_err());
    assert!(batch.is_empty());
    drop(all);
    assert_eq!(pool.in_use(), 0);
    pool.alloc_bulk(&mut batch, 4).unwrap();
    assert_eq!(pool.in_use(), 4);
}

#[test]
fn append_prepend_adj_trim_edit_the_data_window() {
    let pool = common::pool("mb_edit", 63);
    let mut m = pool.alloc().unwrap();
    let head0 = m.headroom();
    let tail0 = m.tailroom();
    assert!(m.is_empty());
    assert_eq!(head0, 128, "standard RTE_PKTMBUF_HEADROOM");

    m.append(10).unwrap().copy_from_slice(b"0123456789");
    assert_eq!(m.data(), b"0123456789");
    assert_eq!(m.tailroom(), tail0 - 10);

    m.prepend(4).unwrap().copy_from_slice(b"HDR:");
    assert_eq!(m.data(), b"HDR:0123456789");
    assert_eq!(m.headroom(), head0 - 4);
    assert_eq!(m.pkt_len(), 14);

    m.adj(4).unwrap();
    assert_eq!(m.data(), b"0123456789");
    m.trim(3).unwrap();
    assert_eq!(m.data(), b"0123456");
    m.data_mut()[0] = b'X';
    assert_eq!(m.data(), b"X123456");

    assert!(matches!(
        m.adj(8),
        Err(Error::NoRoom {
            wanted: 8,
            available: 7,
            ..
        })
    ));
    assert!(matches!(m.trim(100), Err(Error::NoRoom { .. })));
    let too_much = m.tailroom() + 1;
    assert!(matches!(m.append(too_much), Err(Error::NoRoom { .. })));
    assert!(matches!(m.prepend(head0 + 1), Err(Error::NoRoom { .. })));
    assert_eq!(m.data(), b"X123456", "failed edits leave the data alone");
}

#[test]
fn batch_push_pop_and_full() {
    let pool = common::pool("mb_batch", 63);
    let mut batch = MbufBatch::<2>::new();
    batch.push(pool.alloc().unwrap()).unwrap();
    batch.push(pool.alloc().unwrap()).unwrap();
    let extra = pool.alloc().unwrap();
    let back = batch
        .push(extra)
        .expect_err("full batch gives the mbuf back");
    assert_eq!(pool.in_use(), 3);
    drop(back);
    let one = batch.pop().unwrap();
    assert_eq!(batch.len(), 1);
    drop(one);
    drop(batch);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn a_second_eal_init_is_a_clear_error() {
    let _eal = common::eal();
    let err = dpdk_ffi::Eal::init(["--no-pci"])
        .err()
        .expect("second init must fail");
    assert!(matches!(err, Error::AlreadyInitialised));
    assert!(err.to_string().contains("once per process"));
}
