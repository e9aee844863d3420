//! Closures on lcores, and mbufs passed between lcores through rings.

mod common;

use dpdk_ffi::{lcore, Error, MbufBatch, Ring};

#[test]
fn a_closure_runs_on_the_worker_lcore_and_returns_its_result() {
    let eal = common::eal();
    let worker = eal.worker_lcores()[0];
    let job = lcore::launch(&eal, worker, || (lcore::current(), 6 * 7)).unwrap();
    let (ran_on, answer) = job.join().unwrap();
    assert_eq!(ran_on, Some(worker));
    assert_eq!(answer, 42);
    assert_eq!(lcore::current(), Some(eal.main_lcore()));
}

#[test]
fn launching_on_the_main_or_a_disabled_lcore_is_refused() {
    let eal = common::eal();
    let err = lcore::launch(&eal, eal.main_lcore(), || ()).err().unwrap();
    assert!(err.to_string().contains("main lcore"), "{err}");
    let err = lcore::launch(&eal, 100, || ()).err().unwrap();
    assert!(err.to_string().contains("not enabled"), "{err}");
}

#[test]
fn a_panicking_lcore_closure_is_reported_not_fatal() {
    let eal = common::eal();
    let worker = eal.worker_lcores()[0];
    let job = lcore::launch(&eal, worker, || -> u32 { panic!("boom") }).unwrap();
    assert!(matches!(job.join(), Err(Error::LcorePanicked(w)) if w == worker));
    // The lcore is usable again.
    assert_eq!(
        lcore::launch(&eal, worker, || 1).unwrap().join().unwrap(),
        1
    );
}

#[test]
fn spsc_ring_carries_mbufs_between_lcores_in_order() {
    let eal = common::eal();
    let pool = common::pool("r_spsc", 4095);
    let (mut producer, mut consumer) = Ring::spsc(&eal, "r_spsc", 512).unwrap();
    const TOTAL: u32 = 20_000;
    let worker = eal.worker_lcores()[0];
    let tx_pool = pool.clone();
    let job = lcore::launch(&eal, worker, move || {
        let mut batch = MbufBatch::<32>::new();
        let mut seq = 0u32;
        while seq < TOTAL || !batch.is_empty() {
            while !batch.is_full() && seq < TOTAL {
                match tx_pool.alloc() {
                    Ok(mut m) => {
                        m.append(4).unwrap().copy_from_slice(&seq.to_be_bytes());
                        batch.push(m).unwrap();
                        seq += 1;
                    }
                    Err(_) => break, // consumer is behind; retry
                }
            }
            if producer.enqueue_burst(&mut batch) == 0 {
                lcore::pause();
            }
        }
        seq
    })
    .unwrap();

    let mut next = 0u32;
    let mut batch = MbufBatch::<32>::new();
    while next < TOTAL {
        consumer.dequeue_burst(&mut batch);
        for m in batch.iter() {
            assert_eq!(u32::from_be_bytes(m.data().try_into().unwrap()), next);
            next += 1;
        }
        batch.clear();
    }
    assert_eq!(job.join().unwrap(), TOTAL);
    assert!(consumer.is_empty());
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn mbufs_left_in_a_dropped_ring_are_freed() {
    let eal = common::eal();
    let pool = common::pool("r_drop", 1023);
    let (mut p, c) = Ring::mpmc(&eal, "r_drop", 256).unwrap();
    let mut p2 = p.clone();
    let mut batch = MbufBatch::<32>::new();
    pool.alloc_bulk(&mut batch, 32).unwrap();
    assert_eq!(p.enqueue_burst(&mut batch), 32);
    pool.alloc_bulk(&mut batch, 32).unwrap();
    assert_eq!(p2.enqueue_burst(&mut batch), 32);
    assert_eq!(c.len(), 64);
    assert_eq!(pool.in_use(), 64);
    drop((p, p2, c));
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn a_full_ring_leaves_the_rest_in_the_batch() {
    let eal = common::eal();
    let pool = common::pool("r_full", 1023);
    let (mut p, mut c) = Ring::spsc(&eal, "r_full", 40).unwrap();
    let mut batch = MbufBatch::<32>::new();
    pool.alloc_bulk(&mut batch, 32).unwrap();
    assert_eq!(p.enqueue_burst(&mut batch), 32);
    pool.alloc_bulk(&mut batch, 32).unwrap();
    assert_eq!(p.enqueue_burst(&mut batch), 8);
    assert_eq!(batch.len(), 24);
    let mut out = MbufBatch::<32>::new();
    assert_eq!(c.dequeue_burst(&mut out), 32);
    drop((batch, out, p, c));
    assert_eq!(pool.in_use(), 0);
}
