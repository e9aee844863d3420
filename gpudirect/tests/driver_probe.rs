//! A machine with a broken or old libcuda runs host-only; it is not
//! killed. cudarc panics when the driver lacks an entry point, and the
//! release profile aborts on panic, so the probe must find out before it
//! calls one. Each case builds a stand-in libcuda.so with the C compiler
//! and probes in a child process (dlopen reads LD_LIBRARY_PATH at start)
//! whose panic hook aborts, as a release build would.

use std::path::Path;
use std::process::Command;

use gpudirect::Gpu;

/// Set in the child: probe and print what came of it.
const CHILD: &str = "AINFTP_DRIVER_PROBE_CHILD";

/// A libcuda.so built from `c_source` in a fresh directory.
fn fake_driver(c_source: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("fake_cuda.c");
    std::fs::write(&src, c_source).unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.path().join("libcuda.so"))
        .arg(&src)
        .output()
        .expect("a C compiler (cc)");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Runs `probe_in_child` in a child whose libcuda comes from `lib_dir`;
/// its stdout.
fn probe_with(lib_dir: &Path) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "probe_in_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", lib_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the probe killed the process ({:?}): {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Probes this machine's own driver. In the child (CHILD set) under a
/// panic hook that aborts, and prints what came of it.
#[test]
fn probe_in_child() {
    if std::env::var_os(CHILD).is_none() {
        // In the parent: the probe and its reason agree.
        assert_eq!(Gpu::probe().is_host_only(), Gpu::open_device(0).is_err());
        return;
    }
    // What `panic = "abort"` does: no unwinding past the hook.
    std::panic::set_hook(Box::new(|_| std::process::abort()));
    match Gpu::open_device(0) {
        Ok(_) => println!("probe: opened"),
        Err(why) => println!("probe: host-only: {why}"),
    }
}

#[test]
fn an_old_driver_means_host_only_not_an_abort() {
    // Answers the version and cuInit, and has nothing else cudarc calls.
    let dir = fake_driver(
        "int cuDriverGetVersion(int *v) { *v = 11080; return 0; }\n\
         int cuInit(unsigned int flags) { return 0; }\n",
    );
    let said = probe_with(dir.path());
    assert!(
        said.contains("probe: host-only: the CUDA driver is version 11.8; the GPU path needs 12.0"),
        "{said}"
    );
}

#[test]
fn a_library_that_is_not_a_cuda_driver_means_host_only_not_an_abort() {
    let dir = fake_driver("int unrelated(void) { return 0; }\n");
    let said = probe_with(dir.path());
    assert!(
        said.contains("probe: host-only: libcuda.so has no cuDriverGetVersion"),
        "{said}"
    );
}

#[test]
fn a_driver_whose_version_call_fails_means_host_only() {
    // CUDA_ERROR_STUB_LIBRARY (34): the toolkit's stub libcuda, installed
    // where no driver is.
    let dir = fake_driver("int cuDriverGetVersion(int *v) { return 34; }\n");
    let said = probe_with(dir.path());
    assert!(
        said.contains("probe: host-only: cuDriverGetVersion failed: CUDA_ERROR_STUB_LIBRARY"),
        "{said}"
    );
}

#[test]
fn a_code_no_cuda_error_has_is_reported_as_a_number() {
    let dir = fake_driver("int cuDriverGetVersion(int *v) { return 77777; }\n");
    let said = probe_with(dir.path());
    assert!(
        said.contains("probe: host-only: cuDriverGetVersion failed: CUDA error 77777"),
        "{said}"
    );
}
