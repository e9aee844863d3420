#!/usr/bin/env bash
# QUIC goodput and latency, one core per side, on one veth pair: the
# server is ainftp's QUIC over our DPDK stack (af_xdp on the veth), then
# the same quiche endpoint over kernel UDP sockets (GSO/GRO), then kernel
# TCP; the client (kernel side, in a netns) is the same in every run.
# Alternates the servers RUNS times and prints medians and ratios.
#   RUNS=5 BYTES=200000000 RR=5000 ./scripts/bench-quic.sh
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-5}
BYTES=${BYTES:-200000000}
RR=${RR:-5000}
PERF=${PERF:-target/release/ainftp-perf}
NS=bench-qns
[ -x "$PERF" ] || cargo build --release -q -p tools

cleanup() {
    [ -n "${srv:-}" ] && kill -INT "$srv" 2>/dev/null && wait "$srv" 2>/dev/null
    ip link del bench-qa 2>/dev/null || true
    ip netns del $NS 2>/dev/null || true
}
trap cleanup EXIT
cleanup

ip netns add $NS
ip link add bench-qa type veth peer name bench-qb
ip link set bench-qb netns $NS
ip -n $NS addr add 10.96.0.1/24 dev bench-qb
ip -n $NS link set bench-qb up
ip -n $NS link set lo up
# Kernel -> af_xdp over veth needs checksums filled in by the sender.
ip netns exec $NS ethtool -K bench-qb tx off >/dev/null
ip link set bench-qa up

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) {print 0} else if (NR%2) {print a[(NR+1)/2]} else {print (a[NR/2]+a[NR/2+1])/2}}'; }
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])['$2'])" "$1"; }
client() { ip netns exec $NS taskset -c 0 "$PERF" "$@" --json 2>/dev/null | tail -1; }

start_server() { # kind
    case $1 in
    dpdk)
        ip addr flush dev bench-qa
        "$PERF" quic-server --transport dpdk --vdev net_af_xdp0,iface=bench-qa --ip 10.96.0.2/24 \
            --lcores 1 --idle busy --bind 10.96.0.2:4433 --duration 600 >/dev/null 2>&1 &
        srv=$! ;;
    udp)
        ip addr replace 10.96.0.2/24 dev bench-qa
        taskset -c 1 "$PERF" quic-server --transport udp --bind 10.96.0.2:4433 --idle busy \
            --duration 600 >/dev/null 2>&1 &
        srv=$! ;;
    tcp)
        ip addr replace 10.96.0.2/24 dev bench-qa
        taskset -c 1 "$PERF" tcp-server --bind 10.96.0.2:5201 --duration 600 >/dev/null 2>&1 &
        srv=$! ;;
    esac
    sleep 3
}
stop_server() { kill -INT "$srv" 2>/dev/null || true; wait "$srv" 2>/dev/null || true; srv=; }

for k in dpdk udp tcp; do : >"/tmp/bq.$k.gbps"; done
for k in dpdk udp; do : >"/tmp/bq.$k.p50"; : >"/tmp/bq.$k.p99"; : >"/tmp/bq.$k.hs"; done
for r in $(seq "$RUNS"); do
    for k in dpdk udp; do
        start_server $k
        j=$(client quic-client --target 10.96.0.2:4433 --test bulk --bytes "$BYTES" --idle busy) || true
        [ -n "$j" ] && field "$j" gbps >>"/tmp/bq.$k.gbps" && field "$j" handshake_p50_us >>"/tmp/bq.$k.hs"
        j=$(client quic-client --target 10.96.0.2:4433 --test rr --size 64 --count "$RR" --idle busy) || true
        [ -n "$j" ] && field "$j" p50_us >>"/tmp/bq.$k.p50" && field "$j" p99_us >>"/tmp/bq.$k.p99"
        stop_server
    done
    start_server tcp
    j=$(client tcp-client --target 10.96.0.2:5201 --bytes "$BYTES") || true
    [ -n "$j" ] && field "$j" gbps >>/tmp/bq.tcp.gbps
    stop_server
    echo "run $r: goodput Gbit/s quic/dpdk $(tail -1 /tmp/bq.dpdk.gbps) quic/udp $(tail -1 /tmp/bq.udp.gbps) tcp $(tail -1 /tmp/bq.tcp.gbps)"
done
d=$(median </tmp/bq.dpdk.gbps); u=$(median </tmp/bq.udp.gbps); t=$(median </tmp/bq.tcp.gbps)
echo "median goodput (server on one core): quic over dpdk $d Gbit/s, quic over kernel udp $u, kernel tcp $t"
awk -v d="$d" -v u="$u" -v t="$t" 'BEGIN {printf "ratios: dpdk/udp %.2f, dpdk/tcp %.2f\n", (u>0?d/u:0), (t>0?d/t:0)}'
for k in dpdk udp; do
    echo "quic over $k: handshake p50 $(median </tmp/bq.$k.hs) us, 64 B request/response p50 $(median </tmp/bq.$k.p50) us p99 $(median </tmp/bq.$k.p99) us"
done
