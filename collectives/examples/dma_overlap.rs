//! Overlap benchmark: a step of BUCKETS all-reduced buckets with each
//! reduced bucket copied to the GPU (`DevicePipeline`) against the same
//! all-reduces without the copies, on 2 ranks (threads) over kernel UDP on
//! 127.0.0.1. Alternates the two, prints medians and the ratio. Target:
//! with DMA at most 1.1x the time without. Host-only (a host copy) when
//! there is no GPU, and it says so.
//!
//! The buckets live in a hugepage arena registered with CUDA, as the
//! product keeps them (copies from it are asynchronous); `pageable` as
//! the 4th argument puts them in ordinary heap memory instead, which the
//! driver can only copy from through its own staging.
//!
//!   cargo run --release -p collectives --example dma_overlap -- [BUCKETS] [MIB] [RUNS] [pageable]

use std::net::{SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use collectives::driver::{Communicator, DevicePipeline, DriverConfig};
use collectives::ReduceOp;
use gpudirect::{Align, Arena, Gpu, MemOptions, Region};

fn loopback_addrs(n: usize) -> Vec<SocketAddrV4> {
    let socks: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    socks
        .iter()
        .map(|s| match s.local_addr().expect("local address") {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!("bound to an IPv4 address"),
        })
        .collect()
}

/// Where a rank's buckets live.
enum Buckets {
    Heap(Vec<Vec<f32>>),
    /// Regions of an arena registered with CUDA (both held while in use).
    Arena {
        regions: Vec<Region>,
        _registration: Option<gpudirect::HostRegistration>,
        _arena: Arena,
    },
}

impl Buckets {
    fn new(gpu: &Gpu, pageable: bool, buckets: usize, elems: usize, r: usize) -> Buckets {
        let fill = |b: &mut [f32], k: usize| {
            for (i, v) in b.iter_mut().enumerate() {
                *v = ((i + k + r) % 64) as f32;
            }
        };
        if pageable {
            let mut data = vec![vec![0f32; elems]; buckets];
            for (k, b) in data.iter_mut().enumerate() {
                fill(b, k);
            }
            return Buckets::Heap(data);
        }
        let arena = Arena::new(buckets * elems * 4, &MemOptions::default()).expect("arena");
        let registration = (!gpu.is_host_only()).then(|| {
            gpu.register_host(arena.memory().clone())
                .expect("cuMemHostRegister")
        });
        let mut regions: Vec<Region> = (0..buckets)
            .map(|_| {
                arena
                    .alloc(elems * 4, Align::Page4K)
                    .expect("bucket region")
            })
            .collect();
        for (k, reg) in regions.iter_mut().enumerate() {
            fill(bytemuck::cast_slice_mut(reg.as_mut_slice()), k);
        }
        Buckets::Arena {
            regions,
            _registration: registration,
            _arena: arena,
        }
    }

    fn views(&mut self) -> Vec<&mut [f32]> {
        match self {
            Buckets::Heap(data) => data.iter_mut().map(|b| b.as_mut_slice()).collect(),
            Buckets::Arena { regions, .. } => regions
                .iter_mut()
                .map(|reg| bytemuck::cast_slice_mut(reg.as_mut_slice()))
                .collect(),
        }
    }
}

/// Times `runs` steps of each kind, alternating; returns (without, with).
fn rank(
    r: usize,
    peers: Vec<SocketAddrV4>,
    (buckets, elems, runs, pageable): (usize, usize, usize, bool),
) -> (Vec<Duration>, Vec<Duration>, bool) {
    let mut comm = Communicator::new(r, 2, peers, DriverConfig::default()).expect("communicator");
    let gpu = Gpu::probe();
    let mut pipe = DevicePipeline::new(&gpu, elems * 4).expect("device pipeline");
    let host_only = pipe.is_host_only();
    let mut data = Buckets::new(&gpu, pageable, buckets, elems, r);
    let (mut plain, mut dma) = (Vec::new(), Vec::new());
    for run in 0..=runs {
        let t = Instant::now();
        for b in data.views() {
            comm.all_reduce(b, ReduceOp::Sum).expect("all-reduce");
        }
        let without = t.elapsed();
        let mut views = data.views();
        let t = Instant::now();
        pipe.all_reduce(&mut comm, &mut views, ReduceOp::Sum, |_| None)
            .expect("all-reduce with DMA");
        let with = t.elapsed();
        if run > 0 {
            // run 0 warms up connections, buffers and the copy engine
            plain.push(without);
            dma.push(with);
        }
    }
    (plain, dma, host_only)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let arg = |i: usize, default: usize| -> usize {
        std::env::args()
            .nth(i)
            .map(|s| s.parse().expect("BUCKETS, MIB and RUNS are whole numbers"))
            .unwrap_or(default)
    };
    let (buckets, mib, runs) = (arg(1, 8), arg(2, 16), arg(3, 5));
    let pageable = std::env::args().nth(4).is_some_and(|a| a == "pageable");
    let elems = mib * (1 << 20) / 4;
    let peers = loopback_addrs(2);
    let threads: Vec<_> = (0..2)
        .map(|r| {
            let peers = peers.clone();
            std::thread::spawn(move || rank(r, peers, (buckets, elems, runs, pageable)))
        })
        .collect();
    let results: Vec<_> = threads
        .into_iter()
        .map(|t| t.join().expect("rank thread"))
        .collect();
    let (plain, dma, host_only) = results.into_iter().next().expect("rank 0");
    let (p, d) = (median(plain), median(dma));
    println!(
        "# dma_overlap: 2 ranks over kernel UDP, {buckets} buckets x {mib} MiB in {}, medians of {runs}; {}",
        if pageable { "pageable memory" } else { "a registered arena" },
        if host_only { "host-only (no GPU)" } else { "copies to the GPU" }
    );
    println!(
        "without DMA {:.2} ms, with DMA {:.2} ms, ratio {:.3} (target <= 1.1)",
        p.as_secs_f64() * 1e3,
        d.as_secs_f64() * 1e3,
        d.as_secs_f64() / p.as_secs_f64()
    );
}
