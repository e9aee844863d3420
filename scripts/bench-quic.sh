#!/usr/bin/env bash
# QUIC goodput and latency, one core per side (client on CLIENT_CPU, server
# on SERVER_CPU: 0 and 1 by default; on a host with SMT pick two physical
# cores), both sides of each pair the same kind:
#   dpdk: ainftp's QUIC over our DPDK stack at both ends of a net_memif pair
#         (shared memory between the two processes, no kernel on the path);
#   udp:  the same quiche endpoint over kernel UDP sockets (GSO/GRO) at
#         both ends of a veth pair, the client in a netns;
#   tcp:  a plain kernel TCP bulk sender and sink on the same veth pair.
# Every link carries 1500-byte frames (1472-byte UDP payloads), one
# connection, one stream. Alternates the pairs RUNS times; prints medians
# and ratios. Needs root (veth, netns, hugepages).
#   RUNS=5 BYTES=1000000000 RR=5000 ./scripts/bench-quic.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

RUNS=${RUNS:-5}
BYTES=${BYTES:-1000000000}
RR=${RR:-5000}
CLIENT_CPU=${CLIENT_CPU:-0}
SERVER_CPU=${SERVER_CPU:-1}
PERF=${PERF:-target/release/ainftp-perf}
NS=bench-qns
WORK=
[ -x "$PERF" ] || cargo build --release -q -p tools

cleanup() { bench_teardown bench-qa $NS bq; }
trap cleanup EXIT
cleanup
WORK=$(mktemp -d /tmp/ainftp-bq.XXXXXX)

veth_ns_up $NS bench-qa bench-qb 10.96.0.2 10.96.0.1

# Our stack on each end of a memif pair: 10.98.0.2 serves, 10.98.0.1 asks.
MEMIF="socket=$WORK/memif.sock"
DPDK_IP_ARGS=(--transport dpdk --idle busy)

start_server() { # kind
    case $1 in
    dpdk)
        "$PERF" quic-server "${DPDK_IP_ARGS[@]}" --vdev "net_memif0,role=server,$MEMIF" \
            --ip 10.98.0.2/24 --lcores $SERVER_CPU --bind 10.98.0.2:4433 --duration 600 \
            -- --file-prefix bq-srv >/dev/null 2>&1 &
        srv=$! ;;
    udp)
        taskset -c $SERVER_CPU "$PERF" quic-server --transport udp --bind 10.96.0.2:4433 --idle busy \
            --duration 600 >/dev/null 2>&1 &
        srv=$! ;;
    tcp)
        taskset -c $SERVER_CPU "$PERF" tcp-server --bind 10.96.0.2:5201 --duration 600 >/dev/null 2>&1 &
        srv=$! ;;
    esac
    sleep 3
}
stop_server() { kill -INT "$srv" 2>/dev/null || true; wait "$srv" 2>/dev/null || true; srv=; }

client() { # kind, then the client's own flags
    local kind=$1
    shift
    case $kind in
    dpdk)
        "$PERF" quic-client "${DPDK_IP_ARGS[@]}" --vdev "net_memif0,role=client,$MEMIF" \
            --ip 10.98.0.1/24 --lcores $CLIENT_CPU --target 10.98.0.2:4433 "$@" --json \
            -- --file-prefix bq-cli 2>/dev/null | tail -1 ;;
    udp)
        ip netns exec $NS taskset -c $CLIENT_CPU "$PERF" quic-client --transport udp --idle busy \
            --target 10.96.0.2:4433 "$@" --json 2>/dev/null | tail -1 ;;
    esac
}

for k in dpdk udp tcp; do : >"$WORK/$k.gbps"; done
for k in dpdk udp; do : >"$WORK/$k.p50"; : >"$WORK/$k.p99"; : >"$WORK/$k.hs"; done
for r in $(seq "$RUNS"); do
    for k in dpdk udp; do
        start_server $k
        j=$(client $k --test bulk --bytes "$BYTES") || true
        [ -n "$j" ] && field "$j" gbps >>"$WORK/$k.gbps" && field "$j" handshake_p50_us >>"$WORK/$k.hs"
        j=$(client $k --test rr --size 64 --count "$RR") || true
        [ -n "$j" ] && field "$j" p50_us >>"$WORK/$k.p50" && field "$j" p99_us >>"$WORK/$k.p99"
        stop_server
    done
    start_server tcp
    j=$(ip netns exec $NS taskset -c $CLIENT_CPU "$PERF" tcp-client --target 10.96.0.2:5201 --bytes "$BYTES" --json 2>/dev/null | tail -1) || true
    [ -n "$j" ] && field "$j" gbps >>"$WORK/tcp.gbps"
    stop_server
    echo "run $r: goodput Gbit/s quic/dpdk $(tail -1 "$WORK/dpdk.gbps") quic/udp $(tail -1 "$WORK/udp.gbps") tcp $(tail -1 "$WORK/tcp.gbps")"
done
d=$(median <"$WORK/dpdk.gbps"); u=$(median <"$WORK/udp.gbps"); t=$(median <"$WORK/tcp.gbps")
echo "median goodput (one core per side): quic over dpdk (memif) $d Gbit/s, quic over kernel udp $u, kernel tcp $t"
awk -v d="$d" -v u="$u" -v t="$t" 'BEGIN {printf "ratios: dpdk/udp %.2f, dpdk/tcp %.2f\n", (u>0?d/u:0), (t>0?d/t:0)}'
for k in dpdk udp; do
    echo "quic over $k: handshake p50 $(median <"$WORK/$k.hs") us, 64 B request/response p50 $(median <"$WORK/$k.p50") us p99 $(median <"$WORK/$k.p99") us"
done
