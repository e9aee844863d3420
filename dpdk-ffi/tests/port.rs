//! Ports on real DPDK virtual devices: traffic crosses byte-exact, stats
//! count it, bad configuration is a clear error, nothing leaks.

mod common;

use dpdk_ffi::{Error, MbufBatch, Mempool, Port, PortConfig};

fn fill(pool: &Mempool, batch: &mut MbufBatch<32>, first_seq: u32, n: usize, len: usize) {
    for i in 0..n {
        let mut m = pool.alloc().unwrap();
        m.append(len)
            .unwrap()
            .copy_from_slice(&common::frame(first_seq + i as u32, len));
        batch.push(m).unwrap();
    }
}

#[test]
fn net_ring_loops_frames_back_byte_exact_and_counts_them() {
    let eal = common::eal();
    let pool = common::pool("p_ring", 4095);
    let port = Port::open(&eal, "net_ring_loop0", &PortConfig::default(), &pool).unwrap();
    let baseline = pool.in_use();
    let (mut rx, mut tx) = (port.rx_queue(0).unwrap(), port.tx_queue(0).unwrap());

    let sizes = [60usize, 64, 333, 1514];
    let mut out = MbufBatch::<32>::new();
    for (i, &len) in sizes.iter().enumerate() {
        fill(&pool, &mut out, i as u32 * 100, 8, len);
    }
    assert_eq!(tx.tx_burst(&mut out), 32);
    assert!(out.is_empty());

    let mut got = MbufBatch::<32>::new();
    let n = rx.rx_burst(&mut got);
    assert_eq!(n, 32);
    for (k, m) in got.iter().enumerate() {
        let (size_idx, i) = (k / 8, k % 8);
        let expect = common::frame(size_idx as u32 * 100 + i as u32, sizes[size_idx]);
        assert_eq!(m.data(), &expect[..], "frame {k}");
    }
    drop(got);
    let stats = port.stats().unwrap();
    assert_eq!(stats.tx_packets, 32);
    assert_eq!(stats.rx_packets, 32);
    assert!(port.link().up);
    assert!(!port.xstats().unwrap().is_empty());
    assert_eq!(pool.in_use(), baseline, "no mbuf leaked");
}

#[test]
fn unsent_mbufs_stay_in_the_batch_and_are_freed_on_drop() {
    let eal = common::eal();
    let pool = common::pool("p_unsent", 8191);
    // A small ring fills up: the tx burst is refused part-way.
    let cfg = PortConfig {
        tx_descriptors: 64,
        rx_descriptors: 64,
        ..PortConfig::default()
    };
    let port = Port::open(&eal, "net_ring_full0", &cfg, &pool).unwrap();
    let baseline = pool.in_use();
    let mut tx = port.tx_queue(0).unwrap();
    let mut sent_total = 0;
    let mut refused = false;
    for round in 0..200 {
        let mut out = MbufBatch::<32>::new();
        fill(&pool, &mut out, round * 32, 32, 64);
        sent_total += tx.tx_burst(&mut out);
        if !out.is_empty() {
            refused = true;
            // The unsent ones are still ours, in order, at the front.
            let first_unsent =
                u32::from_be_bytes(out.as_slice()[0].data()[14..18].try_into().unwrap());
            assert_eq!(first_unsent as usize, sent_total);
            break; // out drops here with its mbufs
        }
    }
    assert!(refused, "net_ring should fill up");
    assert_eq!(
        pool.in_use() - baseline,
        sent_total as u32,
        "only the sent mbufs are out"
    );

    // A stopped port refuses everything; dropping the batch frees it all.
    let mut rx = port.rx_queue(0).unwrap();
    let mut drain = MbufBatch::<32>::new();
    while rx.rx_burst(&mut drain) > 0 {
        drain.clear();
    }
    assert_eq!(pool.in_use(), baseline);
    // Not while a queue is taken: a burst on another lcore would race the
    // PMD freeing its rings.
    let err = port.stop().unwrap_err().to_string();
    assert!(err.contains("2 of its queues are taken"), "{err}");
    drop((rx, tx));
    port.stop().unwrap();
    // A queue given back can be taken again, stopped or not.
    let mut tx = port.tx_queue(0).unwrap();
    assert!(port.tx_queue(0).is_err(), "one holder at a time");
    assert!(port.start().is_err(), "a queue is taken");
    let mut out = MbufBatch::<32>::new();
    fill(&pool, &mut out, 0, 32, 64);
    assert_eq!(tx.tx_burst(&mut out), 0);
    assert_eq!(out.len(), 32);
    drop(out);
    assert_eq!(pool.in_use(), baseline, "no leak after a refused burst");
}

#[test]
fn net_null_forwards_bursts_without_leaking() {
    let eal = common::eal();
    let pool = common::pool("p_null", 8191);
    let port = Port::open(&eal, "net_null_fwd0,size=64", &PortConfig::default(), &pool).unwrap();
    let (mut rx, mut tx) = (port.rx_queue(0).unwrap(), port.tx_queue(0).unwrap());
    let baseline = pool.in_use();
    let mut batch = MbufBatch::<32>::new();
    let mut forwarded = 0;
    for _ in 0..10_000 {
        rx.rx_burst(&mut batch);
        forwarded += tx.tx_burst(&mut batch);
        batch.clear();
    }
    assert_eq!(forwarded, 320_000);
    assert_eq!(pool.in_use(), baseline);
    assert_eq!(port.info().driver, "net_null");
}

#[test]
fn a_port_open_in_this_process_is_not_opened_again_and_keeps_working() {
    let eal = common::eal();
    let pool = common::pool("p_twice", 8191);
    let port = Port::open(
        &eal,
        "net_null_twice0,size=64",
        &PortConfig::default(),
        &pool,
    )
    .unwrap();
    let err = Port::open(&eal, "net_null_twice0", &PortConfig::default(), &pool)
        .err()
        .expect("a second open is refused");
    assert!(err.to_string().contains("already open"), "{err}");
    // The first owner's queues still run (the refused open did not
    // reconfigure or close the port).
    let (mut rx, mut tx) = (port.rx_queue(0).unwrap(), port.tx_queue(0).unwrap());
    let mut batch = MbufBatch::<32>::new();
    rx.rx_burst(&mut batch);
    assert_eq!(batch.len(), 32);
    assert_eq!(tx.tx_burst(&mut batch), 32);
    // Once closed, it can be opened again.
    drop((rx, tx, port));
    Port::open(
        &eal,
        "net_null_twice0,size=64",
        &PortConfig::default(),
        &pool,
    )
    .unwrap();
}

#[test]
fn queues_are_spread_and_taken_once() {
    let eal = common::eal();
    let pool = common::pool("p_queues", 8191);
    let cfg = PortConfig {
        rx_queues: 4,
        tx_queues: 4,
        ..PortConfig::default()
    };
    let port = Port::open(&eal, "net_null_q0", &cfg, &pool).unwrap();
    assert_eq!(port.features().rx_queues, 4);
    let q2 = port.rx_queue(2).unwrap();
    assert_eq!(q2.queue_id(), 2);
    let again = port.rx_queue(2).err().unwrap();
    assert!(again.to_string().contains("already taken"), "{again}");
    let missing = port.tx_queue(4).err().unwrap();
    assert!(missing.to_string().contains("does not exist"), "{missing}");
}

#[test]
fn rss_key_and_redirection_table_read_back_from_the_device() {
    let eal = common::eal();
    let pool = common::pool("p_rss", 2047);
    let cfg = PortConfig {
        rx_queues: 3,
        tx_queues: 3,
        ..PortConfig::default()
    };
    let port = Port::open(&eal, "net_null_rss0", &cfg, &pool).unwrap();
    assert_ne!(port.features().rss_hf, 0, "net_null does RSS");
    // net_null hashes with Microsoft's verification key, as most NICs do.
    let key = port.rss_key().unwrap();
    assert_eq!(key.len(), 40, "{key:02x?}");
    assert_eq!(
        key[..8],
        [0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2],
        "{key:02x?}"
    );
    let size = port.info().reta_size as usize;
    assert_eq!(port.rss_reta().unwrap().len(), size);
    // Program a table unlike the PMD's default, then read it back.
    let table: Vec<u16> = (0..size).map(|i| (2 - i % 3) as u16).collect();
    port.set_rss_reta(&table).unwrap();
    assert_eq!(port.rss_reta().unwrap(), table);
    let short = port.set_rss_reta(&table[1..]).unwrap_err().to_string();
    assert!(short.contains("redirection entries"), "{short}");
}

#[test]
fn bad_queue_counts_are_clear_errors() {
    let eal = common::eal();
    let pool = common::pool("p_badq", 1023);
    for (rxq, txq) in [(0u16, 1u16), (1, 0), (4096, 1)] {
        let cfg = PortConfig {
            rx_queues: rxq,
            tx_queues: txq,
            ..PortConfig::default()
        };
        let err = Port::open(&eal, "net_null_badq0", &cfg, &pool)
            .err()
            .expect("must fail");
        let msg = err.to_string();
        assert!(matches!(err, Error::Port(_)), "{msg}");
        assert!(msg.contains("queues") && msg.contains("asked"), "{msg}");
    }
    // The failed attempts closed the device: the name is free again.
    Port::open(&eal, "net_null_badq0", &PortConfig::default(), &pool).unwrap();
}

#[test]
fn bad_vdev_and_pci_addresses_are_clear_errors() {
    let eal = common::eal();
    let pool = common::pool("p_baddev", 1023);
    let err = Port::open(&eal, "net_nosuchdriver0", &PortConfig::default(), &pool)
        .err()
        .unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains("cannot open device 'net_nosuchdriver0'"),
        "{msg}"
    );
    assert!(msg.contains("vdev"), "{msg}");

    let err = Port::open(&eal, "net_tap_bad0,iface=", &PortConfig::default(), &pool)
        .err()
        .unwrap();
    assert!(err.to_string().contains("cannot open device"), "{err}");

    let err = Port::open(&eal, "0000:ff:1f.7", &PortConfig::default(), &pool)
        .err()
        .unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains("0000:ff:1f.7") && msg.contains("vfio-pci"),
        "{msg}"
    );

    let err = Port::open(&eal, "garbage", &PortConfig::default(), &pool)
        .err()
        .unwrap();
    assert!(err.to_string().contains("PCI address"), "{err}");
}
