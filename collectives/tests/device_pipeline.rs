//! All-reduced buckets copied to the device by `DevicePipeline`, ranks as
//! threads over kernel UDP on 127.0.0.1. Host-only here (CI has no GPU);
//! the GPU variant is ignored by default and run on a machine with an
//! NVIDIA GPU with `cargo nextest run -p collectives --run-ignored
//! ignored-only` (it fails at once without a GPU instead of passing).

mod common;

use collectives::driver::{Communicator, DevicePipeline, DriverConfig};
use collectives::ReduceOp;
use gpudirect::Gpu;

fn value(rank: usize, bucket: usize, i: usize) -> f32 {
    ((i * 7 + rank * 13 + bucket * 5) % 64) as f32 * 0.25 - 8.0
}

/// Bucket sizes (elements): tiny, odd, larger than one QUIC packet, a prime.
const BUCKETS: [usize; 5] = [1, 1000, 65_537, 262_144, 100_003];

/// What one rank saw: per delivered bucket, (index, slot, had an event,
/// the bytes read back from the mirror's buffer).
type Seen = Vec<(usize, usize, bool, Vec<f32>)>;

/// Runs the pipeline on `world` ranks; `read_back` copies a delivered
/// bucket out of the mirror (host buffer, or device via download).
fn run(world: usize, gpu: fn() -> Gpu) -> Vec<(Seen, Vec<Vec<f32>>, u64)> {
    let peers = common::loopback_addrs(world);
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let peers = peers.clone();
            std::thread::spawn(move || {
                let mut comm = Communicator::new(r, world, peers, DriverConfig::default()).unwrap();
                let gpu = gpu();
                let max = BUCKETS.iter().max().unwrap() * 4;
                let mut pipe = DevicePipeline::new(&gpu, max).unwrap();
                let mut data: Vec<Vec<f32>> = BUCKETS
                    .iter()
                    .enumerate()
                    .map(|(b, &n)| (0..n).map(|i| value(r, b, i)).collect())
                    .collect();
                let mut seen: Seen = Vec::new();
                {
                    let mut buckets: Vec<&mut [f32]> =
                        data.iter_mut().map(|v| v.as_mut_slice()).collect();
                    pipe.all_reduce(&mut comm, &mut buckets, ReduceOp::Sum, |b| {
                        let mut back = vec![0f32; b.bytes / 4];
                        match b.mirror.host(b.slot) {
                            Some(host) => {
                                back.copy_from_slice(bytemuck::cast_slice(&host[..b.bytes]))
                            }
                            None => read_from_device(&b, &mut back),
                        }
                        seen.push((b.index, b.slot, b.event.is_some(), back));
                        None
                    })
                    .unwrap();
                }
                let copied = pipe.counters().bytes_copied;
                comm.barrier().unwrap();
                (seen, data, copied)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Device -> host through a scratch mirror's stream: waits for the upload
/// event, then copies the slot's bytes back.
fn read_from_device(b: &collectives::driver::OnDevice<'_>, out: &mut [f32]) {
    let stream = b.mirror.stream().expect("a device mirror has a stream");
    if let Some(e) = b.event {
        stream.wait(e).unwrap();
    }
    let dev = b.mirror.device(b.slot).unwrap();
    let host: Vec<u8> = stream.clone_dtoh(dev).unwrap();
    out.copy_from_slice(bytemuck::cast_slice(&host[..b.bytes]));
}

fn check(out: &[(Seen, Vec<Vec<f32>>, u64)], world: usize, on_device: bool) {
    let total: usize = BUCKETS.iter().sum::<usize>() * 4;
    for (rank, (seen, data, copied)) in out.iter().enumerate() {
        assert_eq!(*copied, total as u64, "rank {rank}");
        assert_eq!(
            seen.len(),
            BUCKETS.len(),
            "rank {rank}: every bucket delivered once"
        );
        for (k, (index, slot, has_event, back)) in seen.iter().enumerate() {
            assert_eq!(*index, k, "rank {rank}: buckets delivered in order");
            assert_eq!(*slot, k % gpudirect::SLOTS, "rank {rank}: slots alternate");
            assert_eq!(
                *has_event, on_device,
                "rank {rank}: an event exactly when on a device"
            );
            assert_eq!(back.len(), BUCKETS[k]);
            // What reached the mirror is the reduced bucket, bit for bit.
            assert_eq!(
                back, &data[k],
                "rank {rank}, bucket {k}: mirror differs from the result"
            );
            for (i, &got) in back.iter().enumerate() {
                let want: f32 = (0..world).map(|r| value(r, k, i)).sum();
                assert_eq!(got, want, "rank {rank}, bucket {k}, element {i}");
            }
        }
        assert_eq!(data, &out[0].1, "rank {rank} differs from rank 0");
    }
}

#[test]
fn host_only_pipeline_delivers_every_reduced_bucket_in_order() {
    let out = run(3, Gpu::host_only);
    check(&out, 3, false);
}

#[test]
fn a_bucket_larger_than_the_device_buffers_is_refused_before_any_traffic() {
    let gpu = Gpu::host_only();
    let mut pipe = DevicePipeline::new(&gpu, 64).unwrap();
    let peers = common::loopback_addrs(1);
    let mut comm = Communicator::new(0, 1, peers, DriverConfig::default()).unwrap();
    let mut big = vec![1f32; 17];
    let err = pipe
        .all_reduce(&mut comm, &mut [big.as_mut_slice()], ReduceOp::Sum, |_| {
            None
        })
        .unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
    assert_eq!(comm.counters().wakeups, 0, "nothing ran");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --run-ignored"]
fn gpu_pipeline_puts_the_reduced_buckets_in_device_memory() {
    fn gpu() -> Gpu {
        let gpu = Gpu::probe();
        assert!(
            !gpu.is_host_only(),
            "no CUDA driver/GPU here: this test needs an NVIDIA GPU"
        );
        gpu
    }
    let out = run(2, gpu);
    check(&out, 2, true);
}
