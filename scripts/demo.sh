#!/usr/bin/env bash
# ainftp demo: set up the host, build, forward packets with ainftp-perf on
# DPDK virtual devices (a net_null pair: the pure packet-path cost; two
# af_xdp ports on a kernel veth pair), then a 4-rank allreduce over QUIC on
# our DPDK stack (af_xdp on a veth per rank, a bridge between them) next to
# torch.distributed Gloo on the same host. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup-host.sh >/dev/null
echo "== building (release)"
cargo build --release -q -p tools
perf=target/release/ainftp-perf

echo
echo "== ainftp-perf io on net_null0 <-> net_null1, lcores 0-1, 4 s"
$perf io --vdev net_null0 --vdev net_null1 --lcores 0-1 --duration 4 --stats-period 2 | grep -E "summary|port [0-9] \(|total"

echo
echo "== ainftp-perf io on net_af_xdp over a veth pair (demo-a <-> demo-b), 4 s"
ip link del demo-a 2>/dev/null || true
ip link add demo-a type veth peer name demo-b
trap 'ip link del demo-a 2>/dev/null || true' EXIT
for i in demo-a demo-b; do
    echo 1 >/proc/sys/net/ipv6/conf/$i/disable_ipv6
    ip link set $i up
done
# libbpf is chatty on stderr; show it only if the run fails.
log=$(mktemp)
$perf io --vdev net_af_xdp0,iface=demo-a --vdev net_af_xdp1,iface=demo-b --lcores 0-1 \
    --duration 4 --stats-period 2 --tx-first 2>"$log" | grep -E "summary|port [0-9] \(|total" \
    || { cat "$log"; exit 1; }
rm -f "$log"

echo
echo "== ainftp-perf allreduce: 4 ranks, QUIC over our DPDK stack on af_xdp veths (a bridge between them)"
sizes=(-b 8 -e 16M -f 8 -n 5 -w 2)
log=$(mktemp)
$perf allreduce --local-ranks 4 --transport dpdk "${sizes[@]}" 2>"$log" || { cat "$log"; exit 1; }
rm -f "$log"

echo
if /usr/bin/python3 -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
    echo "== the same allreduce with torch.distributed Gloo (kernel TCP), 4 ranks"
    /usr/bin/python3 scripts/gloo_allreduce.py --local-ranks 4 "${sizes[@]}"
else
    echo "== Gloo comparison skipped: python3-torch is missing (scripts/setup-host.sh installs it)"
fi

echo
echo "Medians over several runs, both transports and codecs: ./scripts/bench-allreduce.sh"
echo "Compare with DPDK's own testpmd: ./scripts/bench-io.sh"
