//! Finds the system DPDK with pkg-config, compiles the C shim for the
//! static-inline fast path, and generates bindings for the API we use.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    let dpdk = match pkg_config::Config::new()
        .atleast_version("22.11")
        .probe("libdpdk")
    {
        Ok(lib) => lib,
        Err(e) => {
            eprintln!(
                "libdpdk not found through pkg-config ({e}).\n\
                 Install it with: sudo ./scripts/setup-host.sh (apt-get install libdpdk-dev)"
            );
            std::process::exit(1);
        }
    };

    // pkg-config's cflags also carry `-include rte_config.h` and -march; both
    // matter for struct layout and for the inline functions, so pass them on.
    let extra_cflags: Vec<String> = std::process::Command::new("pkg-config")
        .args(["--cflags", "libdpdk"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();

    let mut build = cc::Build::new();
    build.file("csrc/shim.c").opt_level(3).warnings(false);
    for flag in &extra_cflags {
        build.flag(flag);
    }
    build.compile("ainftp_dpdk_shim");

    let mut builder = bindgen::Builder::default()
        .header("csrc/wrapper.h")
        .clang_args(&extra_cflags)
        .clang_arg("-Icsrc")
        // rte_extmem/rte_dev_dma_map/extbuf pools are marked experimental.
        .clang_arg("-DALLOW_EXPERIMENTAL_API")
        .allowlist_function("rte_eal_.*")
        .allowlist_function("rte_eth_.*")
        .allowlist_function("rte_pktmbuf_pool_create")
        .allowlist_function("rte_pktmbuf_pool_create_extbuf")
        .allowlist_function("rte_extmem_(register|unregister)")
        .allowlist_function("rte_dev_dma_(map|unmap)")
        .allowlist_function("rte_mem_virt2phy")
        .allowlist_function("rte_pktmbuf_free_bulk")
        .allowlist_function("rte_mempool_(avail|in_use)_count")
        .allowlist_function("rte_mempool_free")
        .allowlist_function("rte_ring_(create|free)")
        .allowlist_function("rte_(strerror|socket_id|lcore_count|lcore_to_socket_id|get_main_lcore|get_next_lcore|lcore_is_enabled|lcore_to_cpu_id|version)")
        .allowlist_function("rte_dev_(probe|remove)")
        .allowlist_function("ainftp_.*")
        .allowlist_var("AINFTP_.*")
        .allowlist_var("RTE_ETH_NAME_MAX_LEN|RTE_MAX_LCORE|RTE_ETHER_ADDR_LEN|RTE_PKTMBUF_HEADROOM|RTE_MBUF_DEFAULT_BUF_SIZE|RTE_ETH_XSTATS_NAME_SIZE|SOCKET_ID_ANY|RING_F_.*")
        .allowlist_type("rte_mbuf|rte_eth_.*|rte_ether_addr|rte_pktmbuf_extmem|rte_iova_mode")
        // Packed protocol headers: our own stack::wire parses them.
        .blocklist_type("rte_(ether|ipv4|ipv6|udp|tcp|vlan|arp)_hdr")
        .opaque_type("rte_(ether|ipv4|ipv6|udp|tcp|vlan|arp)_hdr")
        .opaque_type("rte_mempool|rte_ring|rte_eth_dev_.*_cb")
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for inc in &dpdk.include_paths {
        builder = builder.clang_arg(format!("-I{}", inc.display()));
    }
    let bindings = builder
        .generate()
        .expect("bindgen failed on the DPDK headers (is libclang-dev installed?)");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    bindings.write_to_file(out).expect("write bindings");
}
