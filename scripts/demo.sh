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
ours=$(mktemp)
$perf allreduce --local-ranks 4 --transport dpdk "${sizes[@]}" 2>"$log" | tee "$ours" || { cat "$log"; exit 1; }
rm -f "$log"

echo
if /usr/bin/python3 -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
    echo "== the same allreduce with torch.distributed Gloo (kernel TCP), 4 ranks"
    gloo=$(mktemp)
    /usr/bin/python3 scripts/gloo_allreduce.py --local-ranks 4 "${sizes[@]}" | tee "$gloo"
    echo
    echo "== side by side (time_us; speed-up = Gloo time / ainftp time, > 1: ainftp faster)"
    # Rows start with the size; column 7 is time_us in both tables.
    awk 'FNR == 1 { f++ } /^ *[0-9]/ { t[f, $1] = $7; if (f == 1) order[++n] = $1 }
         END { printf "%12s %12s %12s %9s\n", "bytes", "ainftp", "gloo", "speed-up"
               for (i = 1; i <= n; i++) { s = order[i]
                   if ((2, s) in t) printf "%12s %12.1f %12.1f %8.2fx\n", s, t[1, s], t[2, s], t[2, s] / t[1, s] } }' \
        "$ours" "$gloo"
    rm -f "$gloo"
else
    echo "== Gloo comparison skipped: python3-torch is missing (scripts/setup-host.sh installs it)"
fi

rm -f "$ours"
echo
echo "Medians over several runs, both transports and codecs: ./scripts/bench-allreduce.sh"
echo "Compare with DPDK's own testpmd: ./scripts/bench-io.sh"
