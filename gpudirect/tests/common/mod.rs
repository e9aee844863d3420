//! Shared test set-up: hugepages, the EAL (once per process: run with
//! nextest), a tracing layer that counts events, and frame helpers.
#![allow(dead_code)]

pub mod reference;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dpdk_ffi::Eal;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Make sure at least `pages` free 2 MB hugepages exist, reserving more if
/// needed (root), and that hugetlbfs is mounted for DPDK.
pub fn ensure_hugepages(pages: u64) {
    let dir = "/sys/kernel/mm/hugepages/hugepages-2048kB";
    let read = |f: &str| -> u64 {
        std::fs::read_to_string(format!("{dir}/{f}"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (nr, free) = (read("nr_hugepages"), read("free_hugepages"));
    if free < pages {
        std::fs::write(
            format!("{dir}/nr_hugepages"),
            (nr + pages - free).to_string(),
        )
        .expect("reserve 2 MB hugepages (run as root)");
        assert!(
            read("free_hugepages") >= pages,
            "the kernel gave too few 2 MB hugepages (memory fragmented?)"
        );
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    if !mounts
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("hugetlbfs"))
    {
        sh("mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages");
    }
}

pub fn eal(extra: &[&str]) -> Eal {
    ensure_hugepages(64);
    let mut args = vec![
        "-l",
        "0-1",
        "--no-pci",
        "--in-memory",
        "--log-level=*:warning",
    ];
    args.extend_from_slice(extra);
    Eal::init(args).expect("EAL init (root and hugepages: run scripts/setup-host.sh)")
}

pub fn sh(cmd: &str) {
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .status()
        .unwrap();
    assert!(st.success(), "`{cmd}` failed: {st}");
}

/// Counts events at `level` whose message contains `needle`.
#[derive(Clone)]
pub struct Counter {
    level: Level,
    needle: &'static str,
    pub hits: Arc<AtomicUsize>,
}

impl Counter {
    /// Install a counter as this process's global subscriber.
    pub fn install(level: Level, needle: &'static str) -> Counter {
        let c = Counter {
            level,
            needle,
            hits: Arc::new(AtomicUsize::new(0)),
        };
        let subscriber = tracing_subscriber::registry().with(c.clone());
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber per process");
        c
    }

    pub fn count(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl<S: Subscriber> Layer<S> for Counter {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() != self.level {
            return;
        }
        struct Msg(String);
        impl tracing::field::Visit for Msg {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Msg(String::new());
        event.record(&mut m);
        if m.0.contains(self.needle) {
            self.hits.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// `n` bytes that differ per position and seed.
pub fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) as u8 ^ (i >> 8) as u8
        })
        .collect()
}
