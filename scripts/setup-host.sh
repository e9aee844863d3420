#!/usr/bin/env bash
# Prepare a Debian 12 host for ainftp: packages, hugepages, hugetlbfs.
# Idempotent; run as root. Prints what it did.
#   HUGEPAGES=N   2 MB hugepages to reserve (default 1024 = 2 GiB)
set -euo pipefail

HUGEPAGES=${HUGEPAGES:-1024}
say() { printf 'setup-host: %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-host: must run as root (sudo $0)" >&2
    exit 1
fi

packages=(
    dpdk dpdk-dev libdpdk-dev   # DPDK 22.11 LTS: libraries, PMDs, dpdk-testpmd
    pkg-config libclang-dev clang cmake build-essential  # bindgen, the C shim, quiche later
    libxdp-dev libbpf-dev libelf-dev libpcap-dev libnuma-dev
    iproute2 nftables iputils-ping kmod procps ethtool
    python3 python3-pip         # aioquic, the independent QUIC peer of the interop tests
    python3-torch   # torch.distributed Gloo: the peer of scripts/bench-allreduce.sh
)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    say "packages: all present"
fi
say "DPDK $(pkg-config --modversion libdpdk)"

# QUIC over kernel UDP (the collectives driver) asks for 32 MiB socket
# receive buffers: a full buffer drops datagrams, and a dropped tail costs
# a QUIC probe timeout. Only raises the caps, never lowers them.
for k in net.core.rmem_max net.core.wmem_max; do
    if [ "$(sysctl -n "$k")" -lt 33554432 ]; then
        sysctl -qw "$k=33554432"
        say "$k -> 33554432"
    fi
done

# Rust test runner (one process per test: DPDK's EAL is once per process).
if ! cargo nextest --version >/dev/null 2>&1; then
    say "installing cargo-nextest"
    cargo install --locked cargo-nextest >/dev/null
fi

# aioquic, pinned: the QUIC implementation the interop tests run against.
AIOQUIC_VERSION=1.3.0
if [ "$(python3 -c 'import aioquic; print(aioquic.__version__)' 2>/dev/null)" != "$AIOQUIC_VERSION" ]; then
    say "installing aioquic $AIOQUIC_VERSION"
    pip3 install -q --break-system-packages "aioquic==$AIOQUIC_VERSION" 2>&1 | grep -v "^WARNING: Running pip as" || true
    python3 -c 'import aioquic' || { echo "setup-host: aioquic did not install" >&2; exit 1; }
fi

nr=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
cur=$(cat "$nr")
if [ "$cur" -lt "$HUGEPAGES" ]; then
    echo "$HUGEPAGES" > "$nr"
    got=$(cat "$nr")
    say "reserved 2 MB hugepages: $cur -> $got (asked $HUGEPAGES)"
    if [ "$got" -lt "$HUGEPAGES" ]; then
        say "warning: the kernel gave only $got hugepages (memory fragmented?)"
    fi
else
    say "2 MB hugepages: $cur reserved (>= $HUGEPAGES)"
fi

if ! grep -q ' hugetlbfs ' /proc/mounts; then
    mkdir -p /dev/hugepages
    mount -t hugetlbfs nodev /dev/hugepages
    say "mounted hugetlbfs on /dev/hugepages"
else
    say "hugetlbfs: mounted on $(awk '$3=="hugetlbfs"{print $2}' /proc/mounts | tr '\n' ' ')"
fi
# libxdp (net_af_xdp) keeps its XDP dispatcher in bpffs.
if ! grep -q ' /sys/fs/bpf bpf ' /proc/mounts; then
    mkdir -p /sys/fs/bpf
    if mount -t bpf bpf /sys/fs/bpf 2>/dev/null; then
        say "mounted bpffs on /sys/fs/bpf"
    else
        say "warning: could not mount bpffs; af_xdp will load single XDP programs"
    fi
fi
say "done: $(awk '/HugePages_Free/{print $2}' /proc/meminfo) hugepages free"
