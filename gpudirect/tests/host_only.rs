//! Without a CUDA driver the crate runs host-only: the probe says so once,
//! GPU-only parts refuse clearly, and the DMA API still copies byte-exact
//! with the same double-buffering rules.

mod common;

use gpudirect::{Align, Arena, DeviceMirror, Error, Gpu, GpuCodec, MemOptions};

#[test]
fn probe_without_a_driver_is_host_only_and_says_so_once() {
    // SAFETY: only tries to dlopen libcuda.
    let driver = unsafe { gpudirect::cudarc::driver::sys::is_culib_present() };
    if driver {
        // A GPU host: the gpu tests cover it; here only host_only() holds.
        assert!(Gpu::host_only().is_host_only());
        return;
    }
    let notes = common::Counter::install(tracing::Level::INFO, "running host-only");
    let gpu = Gpu::probe();
    assert!(gpu.is_host_only());
    assert!(Gpu::probe_device(3).is_host_only());
    assert_eq!(notes.count(), 1, "one note per process");
    assert!(gpu.context().is_none() && gpu.name().is_none());

    let err = GpuCodec::new(&gpu).err().expect("no codec without a GPU");
    assert!(matches!(err, Error::NoGpu(_)), "{err:?}");
    assert!(err.to_string().contains("host-only"), "{err}");

    common::ensure_hugepages(2);
    let arena = Arena::new(2 << 20, &MemOptions::default()).unwrap();
    let reg = gpu.register_host(arena.memory().clone()).unwrap();
    assert!(!reg.is_registered());
    assert!(matches!(reg.device_ptr(0), Err(Error::NoGpu(_))));
}

#[test]
fn gpu_measurements_refuse_host_only() {
    let gpu = Gpu::host_only();
    let err = gpudirect::bench::copy_rates(&gpu, 4096, 2).unwrap_err();
    assert!(matches!(err, Error::NoGpu(_)), "{err:?}");
    let err = gpudirect::bench::codec_rate(&gpu, 4096, 2).unwrap_err();
    assert!(matches!(err, Error::NoGpu(_)), "{err:?}");
}

#[test]
fn host_only_mirror_copies_byte_exact_and_alternates_buffers() {
    common::ensure_hugepages(8);
    let arena = Arena::new(8 << 20, &MemOptions::default()).unwrap();
    let cap = 1 << 20;
    let mut src = arena.alloc(cap, Align::CacheLine).unwrap();
    let mut dst = arena.alloc(cap, Align::CacheLine).unwrap();
    let mut mirror = DeviceMirror::new(&Gpu::host_only(), cap).unwrap();
    assert!(mirror.is_host_only() && mirror.stream().is_none());

    for (k, len) in [1usize, 7, 4095, 4096, 65537, cap].into_iter().enumerate() {
        let data = common::pattern(len, k as u32);
        src.as_mut_slice()[..len].copy_from_slice(&data);
        let t = mirror.upload(&src.as_slice()[..len]).unwrap();
        assert_eq!((t.slot(), t.len()), (k % 2, len), "slots alternate");
        assert!(t.is_done() && t.event().is_none());
        let slot = t.wait().unwrap();
        assert_eq!(
            &mirror.host(slot).unwrap()[..len],
            &data[..],
            "upload of {len} bytes"
        );

        // The "device" modifies it; the download brings that back.
        mirror.host_mut(slot).unwrap()[0] ^= 0xff;
        let back = &mut dst.as_mut_slice()[..len];
        mirror.download(slot, back, None).unwrap().wait().unwrap();
        let mut want = data.clone();
        want[0] ^= 0xff;
        assert_eq!(&dst.as_slice()[..len], &want[..], "download of {len} bytes");
        mirror.release(slot, None).unwrap();
    }

    // A slot not released is not overwritten.
    let a = mirror.upload(&src.as_slice()[..8]).unwrap().wait().unwrap();
    let b = mirror.upload(&src.as_slice()[..8]).unwrap().wait().unwrap();
    assert_ne!(a, b);
    let busy = mirror.upload(&src.as_slice()[..8]).err().unwrap();
    assert!(matches!(busy, Error::SlotBusy(s) if s == a), "{busy:?}");
    assert!(busy.to_string().contains("release"), "{busy}");
    mirror.release(a, None).unwrap();
    assert_eq!(mirror.upload(&src.as_slice()[..8]).unwrap().slot(), a);

    // Too large for the buffers: an error naming the fix.
    let big = vec![0u8; cap + 1];
    let err = mirror.upload(&big).err().unwrap();
    assert!(err.to_string().contains("larger capacity"), "{err}");
    assert!(DeviceMirror::new(&Gpu::host_only(), 0).is_err());
}
