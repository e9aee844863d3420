//! A port EAL probed itself (`--vdev` here, `-a` for a NIC) rather than
//! one `Port::open` hot-plugs: a refused configuration leaves it to be
//! opened again, as the stack does when it retries with fewer queues.

use dpdk_ffi::{Eal, MbufBatch, Mempool, Port, PortConfig, DEFAULT_DATA_ROOM};

#[test]
fn an_eal_probed_port_whose_configuration_was_refused_opens_again() {
    let eal = Eal::init([
        "-l",
        "0-1",
        "--no-pci",
        "--in-memory",
        "--vdev",
        "net_null_probed0,size=64",
        "--log-level=*:warning",
    ])
    .expect("EAL init (run scripts/setup-host.sh for hugepages)");
    let pool = Mempool::new(&eal, "p_probed", 2047, 0, DEFAULT_DATA_ROOM, None).unwrap();
    let too_many = PortConfig {
        rx_queues: 4096,
        ..PortConfig::default()
    };
    let err = Port::open(&eal, "net_null_probed0", &too_many, &pool)
        .err()
        .expect("4096 rx queues are refused");
    assert!(err.to_string().contains("queues"), "{err}");
    // Still there, found by name (not hot-plugged), and it works.
    let port = Port::open(&eal, "net_null_probed0", &PortConfig::default(), &pool)
        .expect("the port opens again");
    let mut rx = port.rx_queue(0).unwrap();
    let mut batch = MbufBatch::<32>::new();
    assert_eq!(rx.rx_burst(&mut batch), 32);
}
