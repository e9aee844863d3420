//! Two net_af_xdp ports on the two ends of a veth pair: frames go through
//! the kernel's veth and come back byte-exact, both ways.

mod common;

use std::time::{Duration, Instant};

use dpdk_ffi::{MbufBatch, Port, PortConfig, RxQueue, TxQueue};

fn send_and_receive(
    pool: &dpdk_ffi::Mempool,
    tx: &mut TxQueue,
    rx: &mut RxQueue,
    first_seq: u32,
    sizes: &[usize],
) {
    let mut out = MbufBatch::<32>::new();
    for (i, &len) in sizes.iter().enumerate() {
        let mut m = pool.alloc().unwrap();
        m.append(len)
            .unwrap()
            .copy_from_slice(&common::frame(first_seq + i as u32, len));
        out.push(m).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !out.is_empty() {
        tx.tx_burst(&mut out);
        assert!(Instant::now() < deadline, "tx stuck");
    }
    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut batch = MbufBatch::<32>::new();
    while got.len() < sizes.len() {
        assert!(
            Instant::now() < deadline,
            "received {} of {}",
            got.len(),
            sizes.len()
        );
        rx.rx_burst(&mut batch);
        for m in batch.iter() {
            // Only our experimental ethertype; the kernel may add its own.
            if m.data().get(12..14) == Some(&[0x88, 0xb5]) {
                got.push(m.data().to_vec());
            }
        }
        batch.clear();
        std::thread::sleep(Duration::from_micros(200));
    }
    for (i, &len) in sizes.iter().enumerate() {
        assert_eq!(
            got[i],
            common::frame(first_seq + i as u32, len),
            "frame {i} ({len} B)"
        );
    }
}

#[test]
fn frames_cross_a_veth_pair_between_two_af_xdp_ports() {
    let veth = common::Veth::new("afxrt-a", "afxrt-b");
    let eal = common::eal();
    let pool = common::pool("afx_rt", 8191);
    let cfg = PortConfig::default();
    let a = Port::open(&eal, &format!("net_af_xdp_a,iface={}", veth.a), &cfg, &pool).unwrap();
    let b = Port::open(&eal, &format!("net_af_xdp_b,iface={}", veth.b), &cfg, &pool).unwrap();
    assert_eq!(a.info().driver, "net_af_xdp");
    let (mut a_rx, mut a_tx) = (a.rx_queue(0).unwrap(), a.tx_queue(0).unwrap());
    let (mut b_rx, mut b_tx) = (b.rx_queue(0).unwrap(), b.tx_queue(0).unwrap());
    let baseline = pool.in_use();

    let sizes: Vec<usize> = [60, 64, 128, 512, 1000, 1514]
        .into_iter()
        .cycle()
        .take(30)
        .collect();
    send_and_receive(&pool, &mut a_tx, &mut b_rx, 0, &sizes);
    send_and_receive(&pool, &mut b_tx, &mut a_rx, 1000, &sizes);

    assert!(a.stats().unwrap().tx_packets >= sizes.len() as u64);
    assert!(b.stats().unwrap().rx_packets >= sizes.len() as u64);
    // af_xdp returns completed tx buffers lazily; give it a burst to reap.
    let mut empty = MbufBatch::<32>::new();
    a_tx.tx_burst(&mut empty);
    assert!(
        pool.in_use() <= baseline + 64,
        "mbufs leaking: {} in use vs {baseline}",
        pool.in_use()
    );
}
