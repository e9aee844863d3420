//! An extbuf mempool over the arena on a real net_tap port: frames the
//! kernel sends land, byte-exact, in the arena's memory. One EAL per test
//! process (nextest), one IOVA mode per test.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use dpdk_ffi::{IovaMode, MbufBatch, Port, PortConfig, DEFAULT_DATA_ROOM};
use gpudirect::{Arena, DpdkArena, MemOptions, PageSize};

const UDP_PORT: u16 = 9000;

fn payload(k: usize) -> Vec<u8> {
    // Sizes from 1 byte to a full 1500-byte MTU frame's payload.
    let len = [1usize, 2, 17, 64, 333, 1000, 1472][k % 7];
    common::pattern(len, k as u32)
}

fn tap_receives_into_the_arena(iova_arg: Option<&str>, iface: &str, net: u8) -> IovaMode {
    let extra: Vec<&str> = iova_arg.into_iter().collect();
    let eal = common::eal(&extra);
    let arena = Arena::new(
        32 << 20,
        &MemOptions {
            page_size: Some(PageSize::Huge2M),
            fallback: false,
            ..MemOptions::default()
        },
    )
    .unwrap();
    let dpdk = DpdkArena::register(&eal, &arena).unwrap();
    assert_eq!(dpdk.iova_mode(), IovaMode::current(&eal));
    let free_before = arena.free_bytes();
    let pool = dpdk
        .pktmbuf_pool("gd_ext", 2047, 0, DEFAULT_DATA_ROOM)
        .unwrap();
    assert!(
        arena.free_bytes() < free_before,
        "the pool's buffers come from the arena"
    );

    // A pool that cannot fit says so instead of failing inside DPDK.
    let too_big = dpdk
        .pktmbuf_pool("gd_big", 1 << 20, 0, DEFAULT_DATA_ROOM)
        .expect_err("a million mbufs do not fit 32 MB");
    assert!(too_big.to_string().contains("arena exhausted"), "{too_big}");
    // Nor can buffers of no bytes (the element arithmetic divided by 0).
    let empty = dpdk
        .pktmbuf_pool("gd_empty", 16, 0, 0)
        .expect_err("a data room of 0");
    assert!(empty.to_string().contains("data room of 0"), "{empty}");

    let port = Port::open(
        &eal,
        &format!("net_tap_gd{net},iface={iface}"),
        &PortConfig::default(),
        &pool,
    )
    .unwrap();
    // The port mapped the pool's external memory for its device when it
    // opened (net_tap copies with the CPU: the vdev bus accepts the mapping
    // as a no-op) and unmaps it when it closes.
    assert!(
        port.dma_mapped_runs().is_some(),
        "a port over an extbuf pool holds a DMA mapping of its memory"
    );
    let baseline = pool.in_use();

    let mac = port.mac();
    let mac = mac.map(|b| format!("{b:02x}")).join(":");
    let (kernel_ip, dpdk_ip) = (Ipv4Addr::new(10, 91, net, 1), Ipv4Addr::new(10, 91, net, 2));
    common::sh(&format!(
        "echo 1 > /proc/sys/net/ipv6/conf/{iface}/disable_ipv6; \
         ip addr add {kernel_ip}/24 dev {iface} && ip link set {iface} up && \
         ip neigh replace {dpdk_ip} lladdr {mac} dev {iface} nud permanent"
    ));
    let sock = UdpSocket::bind(SocketAddrV4::new(kernel_ip, 0)).unwrap();
    let to = SocketAddrV4::new(dpdk_ip, UDP_PORT);

    let mut rx = port.rx_queue(0).unwrap();
    let sent = 64;
    let mut got = vec![false; sent];
    let mut burst = MbufBatch::<32>::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut next_send = 0;
    while got.iter().any(|g| !g) && Instant::now() < deadline {
        if next_send < sent {
            let mut p = payload(next_send);
            p[0] = next_send as u8; // which datagram this is
            sock.send_to(&p, to).unwrap();
            next_send += 1;
        }
        rx.rx_burst(&mut burst);
        for m in burst.iter() {
            let d = m.data();
            let udp_to_us = d.len() >= 42
                && d[12..14] == [0x08, 0x00]
                && d[23] == 17
                && d[36..38] == UDP_PORT.to_be_bytes();
            if !udp_to_us {
                continue; // ARP, IGMP, ... from the kernel
            }
            let (first, last) = (d.as_ptr(), &d[d.len() - 1] as *const u8);
            assert!(
                arena.contains(first) && arena.contains(last),
                "frame at {first:?} is outside the arena"
            );
            let body = &d[42..];
            let k = body[0] as usize;
            let mut want = payload(k);
            want[0] = k as u8;
            assert_eq!(body, &want[..], "datagram {k} byte-exact");
            got[k] = true;
        }
        burst.clear();
        std::thread::sleep(Duration::from_micros(200));
    }
    let missing: Vec<_> = (0..sent).filter(|&k| !got[k]).collect();
    assert!(missing.is_empty(), "datagrams never received: {missing:?}");
    assert_eq!(pool.in_use(), baseline, "every mbuf went back to the pool");
    let mode = dpdk.iova_mode();
    drop((rx, port, pool, dpdk));
    assert_eq!(
        arena.free_bytes(),
        arena.capacity(),
        "the pool's region came back"
    );
    mode
}

#[test]
fn tap_frames_land_in_the_arena_with_the_default_iova_mode() {
    let mode = tap_receives_into_the_arena(None, "gdtap0", 0);
    // Root without an IOMMU: EAL picks physical addresses, so the pool is
    // built page by page.
    eprintln!("IOVA mode: {mode:?}");
}

#[test]
fn tap_frames_land_in_the_arena_with_iova_as_va() {
    let mode = tap_receives_into_the_arena(Some("--iova-mode=va"), "gdtap1", 1);
    assert_eq!(mode, IovaMode::Va);
}

#[test]
fn tap_frames_land_in_the_arena_with_iova_as_pa() {
    let mode = tap_receives_into_the_arena(Some("--iova-mode=pa"), "gdtap2", 2);
    assert_eq!(mode, IovaMode::Pa);
}
