#!/usr/bin/env bash
# ainftp-perf io vs dpdk-testpmd --forward-mode=io, on the same virtual
# devices, lcores and burst, alternating runs. Prints the medians and ratio.
#   RUNS=5 DURATION=6 BURST=32 DEVICES="null af_xdp memif" scripts/bench-io.sh
# ainftp-perf runs with --idle busy: testpmd busy-polls too.
# Rate = forwarded packets per second summed over ports, from the periodic
# Rx-pps lines both tools print (first 2 periods dropped as warm-up); median
# over periods, then median over runs. Needs root (veth, hugepages).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

RUNS=${RUNS:-5}
DURATION=${DURATION:-6}
BURST=${BURST:-32}
DEVICES=${DEVICES:-"null af_xdp memif"}
PERF=${PERF:-target/release/ainftp-perf}
TESTPMD=${TESTPMD:-dpdk-testpmd}
WORK=$(mktemp -d /tmp/ainftp-bench.XXXXXX)

cleanup() {
    ip link del bench-xa 2>/dev/null || true
    rm -rf "$WORK" /dev/hugepages/ainftp-bench-* 2>/dev/null || true
}
trap cleanup EXIT

if [ ! -x "$PERF" ]; then
    cargo build --release -q -p tools
fi
command -v "$TESTPMD" >/dev/null || { echo "bench-io: $TESTPMD not found; run scripts/setup-host.sh" >&2; exit 1; }


# Sum the Rx-pps of $2 ports per period in log $1; drop 2 warm-up periods;
# print the median period.
period_rate() {
    grep -E '^ +Rx-pps:' "$1" | awk -v ports="$2" '{s+=$2; n++; if (n%ports==0) {print s; s=0}}' \
        | tail -n +3 | median
}

testpmd_common=(--no-pci --log-level='*:warning' --huge-unlink)
run_pair() { # name testpmd-args... -- perf-args...
    local dev=$1; shift
    local tp=() pf=()
    while [ "$1" != "--" ]; do tp+=("$1"); shift; done; shift
    pf=("$@")
    timeout -s INT $((DURATION + 3)) "$TESTPMD" -l 0-1 "${testpmd_common[@]}" --file-prefix ainftp-bench-tp "${tp[@]}" \
        -- --forward-mode=io --nb-cores=1 --burst="$BURST" --stats-period 1 "${TP_EXTRA[@]}" >"$WORK/tp.log" 2>&1 || true
    "$PERF" io --idle busy --lcores 0-1 --burst "$BURST" --duration "$DURATION" --stats-period 1 "${pf[@]}" >"$WORK/pf.log" 2>&1 || true
}

# memif: a server and a client process, each forwarding on its own core;
# the rate is the client's.
run_memif() {
    local sock=$WORK/memif.sock
    rm -f "$sock"
    timeout -s INT $((DURATION + 6)) "$TESTPMD" -l 0-1 "${testpmd_common[@]}" --file-prefix ainftp-bench-ms \
        --vdev "net_memif0,role=server,socket=$sock" -- --forward-mode=io --nb-cores=1 --burst="$BURST" \
        --stats-period 1 >/dev/null 2>&1 &  # a stats period keeps testpmd from waiting on stdin
    local srv=$!
    sleep 1.5
    timeout -s INT $((DURATION + 3)) "$TESTPMD" -l 0-1 --main-lcore 1 "${testpmd_common[@]}" --file-prefix ainftp-bench-mc \
        --vdev "net_memif0,role=client,socket=$sock" -- --forward-mode=io --nb-cores=1 --burst="$BURST" \
        --stats-period 1 --tx-first >"$WORK/tp.log" 2>&1 || true
    kill -INT $srv 2>/dev/null || true; wait $srv 2>/dev/null || true
    rm -f "$sock"
    "$PERF" io --idle busy --lcores 0-1 --burst "$BURST" --duration $((DURATION + 5)) --stats-period 0 \
        --vdev "net_memif0,role=server,socket=$sock" -- --file-prefix ainftp-bench-ms --huge-unlink >/dev/null 2>&1 &
    srv=$!
    sleep 1.5
    "$PERF" io --idle busy --lcores 0-1 --burst "$BURST" --duration "$DURATION" --stats-period 1 --tx-first \
        --vdev "net_memif0,role=client,socket=$sock" -- --file-prefix ainftp-bench-mc --main-lcore 1 --huge-unlink \
        >"$WORK/pf.log" 2>&1 || true
    kill -INT $srv 2>/dev/null || true; wait $srv 2>/dev/null || true
}

printf '%-8s %5s %18s %18s %7s\n' device runs "testpmd Mpps" "ainftp-perf Mpps" ratio
for dev in $DEVICES; do
    : >"$WORK/tp.rates"; : >"$WORK/pf.rates"
    TP_EXTRA=()
    case $dev in
        null) ports=2 ;;
        af_xdp)
            ports=2
            ip link del bench-xa 2>/dev/null || true
            ip link add bench-xa type veth peer name bench-xb
            for i in bench-xa bench-xb; do
                echo 1 >/proc/sys/net/ipv6/conf/$i/disable_ipv6
                ip link set $i up
            done
            TP_EXTRA=(--tx-first) ;;
        memif) ports=1 ;;
        *) echo "bench-io: unknown device '$dev' (null, af_xdp, memif)" >&2; exit 2 ;;
    esac
    for _ in $(seq "$RUNS"); do
        case $dev in
            null) run_pair null --vdev net_null0 --vdev net_null1 -- --vdev net_null0 --vdev net_null1 ;;
            af_xdp) run_pair af_xdp --vdev net_af_xdp0,iface=bench-xa --vdev net_af_xdp1,iface=bench-xb -- \
                        --vdev net_af_xdp0,iface=bench-xa --vdev net_af_xdp1,iface=bench-xb --tx-first ;;
            memif) run_memif ;;
        esac
        period_rate "$WORK/tp.log" "$ports" >>"$WORK/tp.rates"
        period_rate "$WORK/pf.log" "$ports" >>"$WORK/pf.rates"
    done
    tp=$(median <"$WORK/tp.rates"); pf=$(median <"$WORK/pf.rates")
    awk -v d="$dev" -v r="$RUNS" -v t="$tp" -v p="$pf" \
        'BEGIN {printf "%-8s %5d %18.2f %18.2f %7.3f\n", d, r, t/1e6, p/1e6, (t>0 ? p/t : 0)}'
    if [ -n "${VERBOSE:-}" ]; then
        echo "  testpmd runs: $(tr '\n' ' ' <"$WORK/tp.rates")"
        echo "  ainftp  runs: $(tr '\n' ' ' <"$WORK/pf.rates")"
    fi
    [ "$dev" = af_xdp ] && ip link del bench-xa 2>/dev/null || true
done
