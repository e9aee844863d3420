#!/usr/bin/env bash
# The stack against its peers, in one run on the same machine:
#  1. UDP echo packets/s on one lcore: ainftp-dp --udp-echo vs
#     dpdk-testpmd --forward-mode=macswap and =5tswap, on the same vdev
#     (net_pcap replaying 64 UDP flows from memory with infinite_rx; tx
#     dropped) and the same core. ainftp-dp does the whole host path
#     (parse, verify IP and UDP checksums, demux, turn the headers around);
#     testpmd's macswap swaps MACs, its 5tswap swaps MACs, IP addresses and
#     ports (the same turnaround, without any validation), and its csum
#     engine parses L2-L4 and computes the IP and UDP checksums in
#     software (net_pcap has no offload): the testpmd engine whose work
#     is closest to a host path.
#  2. UDP ping-pong latency over one veth pair: a kernel UDP client in a
#     network namespace against (a) ainftp-dp's echo on net_af_xdp and
#     (b) the kernel's UDP stack (ainftp-perf udp-echo on the same veth).
# Runs alternate; medians over RUNS. Needs root (veth, netns, hugepages).
#   RUNS=5 DURATION=6 PINGS=20000 scripts/bench-stack.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

RUNS=${RUNS:-5}
DURATION=${DURATION:-6}
PINGS=${PINGS:-20000}
DP=${DP:-target/release/ainftp-dp}
PERF=${PERF:-target/release/ainftp-perf}
TESTPMD=${TESTPMD:-dpdk-testpmd}
WORK=$(mktemp -d /tmp/ainftp-bench-stack.XXXXXX)

cleanup() {
    ip link del bench-la 2>/dev/null || true
    ip link del bench-xa 2>/dev/null || true
    ip netns del bench-ns 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

if [ ! -x "$DP" ] || [ ! -x "$PERF" ]; then
    cargo build --release -q -p tools
fi
command -v "$TESTPMD" >/dev/null || { echo "bench-stack: $TESTPMD not found; run scripts/setup-host.sh" >&2; exit 1; }

# 64 UDP flows 10.99.0.1:(10000+i) -> 10.99.0.2:7, 60-byte frames, valid
# checksums, addressed to the MAC ainftp-dp is given.
python3 - "$WORK/flows.pcap" <<'PY'
import struct, sys
def csum(b):
    if len(b) % 2: b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return (~s) & 0xffff
src, dst = bytes([10, 99, 0, 1]), bytes([10, 99, 0, 2])
out = [struct.pack('<IHHiIII', 0xa1b2c3d4, 2, 4, 0, 0, 65535, 1)]
for i in range(64):
    payload = bytes(range(18))
    udp_len = 8 + len(payload)
    pseudo = src + dst + struct.pack('!BBH', 0, 17, udp_len)
    udp = struct.pack("!HHHH", 10000 + i, 7, udp_len, 0) + payload
    uc = csum(pseudo + udp) or 0xffff
    udp = udp[:6] + struct.pack('!H', uc) + udp[8:]
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + udp_len, i, 0x4000, 64, 17, 0, src, dst)
    ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
    frame = bytes.fromhex('020000000002' '020000000001' '0800') + ip + udp
    out.append(struct.pack('<IIII', 0, 0, len(frame), len(frame)) + frame)
open(sys.argv[1], 'wb').write(b''.join(out))
PY
PCAP="net_pcap0,rx_pcap=$WORK/flows.pcap,infinite_rx=1"

# Median of the per-period rates after 2 warm-up periods.
testpmd_rate() { grep -E '^ +Rx-pps:' "$1" | awk '{print $2}' | tail -n +3 | median; }
dp_rate() { grep -E '^lcore +[0-9]+: rx-pps' "$1" | awk '{print $4}' | tail -n +3 | median; }

echo "== UDP echo on one lcore (net_pcap replay, 64 flows, 60 B frames) =="
: >"$WORK/tp.rates"; : >"$WORK/t5.rates"; : >"$WORK/tc.rates"; : >"$WORK/dp.rates"
for r in $(seq "$RUNS"); do
    timeout -s INT $((DURATION + 3)) "$TESTPMD" -l 0-1 --no-pci --in-memory --log-level='*:warning' \
        --vdev "$PCAP" -- --forward-mode=macswap --nb-cores=1 --stats-period 1 >"$WORK/tp.log" 2>&1 || true
    testpmd_rate "$WORK/tp.log" >>"$WORK/tp.rates"
    timeout -s INT $((DURATION + 3)) "$TESTPMD" -l 0-1 --no-pci --in-memory --log-level='*:warning' \
        --vdev "$PCAP" -- --forward-mode=5tswap --nb-cores=1 --stats-period 1 >"$WORK/tp.log" 2>&1 || true
    testpmd_rate "$WORK/tp.log" >>"$WORK/t5.rates"
    timeout -s INT $((DURATION + 3)) "$TESTPMD" -l 0-1 --no-pci --in-memory --log-level='*:warning' \
        --vdev "$PCAP" -- --forward-mode=csum --nb-cores=1 --stats-period 1 >"$WORK/tp.log" 2>&1 || true
    testpmd_rate "$WORK/tp.log" >>"$WORK/tc.rates"
    "$DP" --lcores 1 --vdev "$PCAP" --ip 10.99.0.2/24 --mac 02:00:00:00:00:02 \
        --neighbour 10.99.0.1=02:00:00:00:00:01 --udp-echo 7 --idle busy \
        --stats-period 1 --duration "$DURATION" >"$WORK/dp.log" 2>&1 || true
    dp_rate "$WORK/dp.log" >>"$WORK/dp.rates"
    echo "run $r: testpmd macswap $(tail -1 "$WORK/tp.rates") pps, 5tswap $(tail -1 "$WORK/t5.rates") pps, csum $(tail -1 "$WORK/tc.rates") pps, ainftp-dp udp echo $(tail -1 "$WORK/dp.rates") pps"
done
tp=$(median <"$WORK/tp.rates"); t5=$(median <"$WORK/t5.rates"); tc=$(median <"$WORK/tc.rates"); dp=$(median <"$WORK/dp.rates")
awk -v t="$tp" -v f="$t5" -v c="$tc" -v d="$dp" 'BEGIN {printf "median: testpmd macswap %.2f Mpps, 5tswap %.2f Mpps, csum %.2f Mpps, ainftp-dp udp echo %.2f Mpps, ratio to macswap %.3f, to 5tswap %.3f, to csum %.3f\n", t/1e6, f/1e6, c/1e6, d/1e6, (t>0 ? d/t : 0), (f>0 ? d/f : 0), (c>0 ? d/c : 0)}'

echo "== UDP echo on one lcore over af_xdp (veth pair; testpmd txonly generates on the other end) =="
ip link del bench-xa 2>/dev/null || true
ip link add bench-xa type veth peer name bench-xb
ip link set bench-xa up; ip link set bench-xb up
GEN_MAC=$(cat /sys/class/net/bench-xb/address)
generator() {
    timeout -s INT $((DURATION + 6)) "$TESTPMD" -l 0-1 --main-lcore 1 --no-pci --in-memory --log-level='*:warning' \
        --vdev net_af_xdp1,iface=bench-xb -- --forward-mode=txonly --nb-cores=1 --stats-period 1 \
        --eth-peer=0,02:00:00:00:00:02 --tx-ip=10.97.0.1,10.97.0.2 --tx-udp=10000,7 >/dev/null 2>&1 &
    gen=$!
}
: >"$WORK/tpx.rates"; : >"$WORK/dpx.rates"
for r in $(seq "$RUNS"); do
    generator
    timeout -s INT $((DURATION + 3)) "$TESTPMD" -l 0-1 --no-pci --in-memory --log-level='*:warning' \
        --vdev net_af_xdp0,iface=bench-xa -- --forward-mode=macswap --nb-cores=1 --stats-period 1 \
        >"$WORK/tpx.log" 2>&1 || true
    kill -INT $gen 2>/dev/null || true; wait $gen 2>/dev/null || true
    testpmd_rate "$WORK/tpx.log" >>"$WORK/tpx.rates"
    generator
    "$DP" --lcores 1 --vdev net_af_xdp0,iface=bench-xa --ip 10.97.0.2/24 --mac 02:00:00:00:00:02 \
        --neighbour "10.97.0.1=$GEN_MAC" --udp-echo 7 --idle busy \
        --stats-period 1 --duration "$DURATION" >"$WORK/dpx.log" 2>&1 || true
    kill -INT $gen 2>/dev/null || true; wait $gen 2>/dev/null || true
    dp_rate "$WORK/dpx.log" >>"$WORK/dpx.rates"
    echo "run $r: testpmd macswap $(tail -1 "$WORK/tpx.rates") pps, ainftp-dp udp echo $(tail -1 "$WORK/dpx.rates") pps"
done
ip link del bench-xa
tp=$(median <"$WORK/tpx.rates"); dp=$(median <"$WORK/dpx.rates")
awk -v t="$tp" -v d="$dp" 'BEGIN {printf "median: testpmd macswap %.3f Mpps, ainftp-dp udp echo %.3f Mpps, ratio %.3f\n", t/1e6, d/1e6, (t>0 ? d/t : 0)}'

echo "== UDP ping-pong over a veth pair: kernel client in a netns =="
ip netns del bench-ns 2>/dev/null || true
ip link del bench-la 2>/dev/null || true
ip netns add bench-ns
ip link add bench-la type veth peer name bench-lb
ip link set bench-lb netns bench-ns
ip -n bench-ns addr add 10.98.0.1/24 dev bench-lb
ip -n bench-ns link set bench-lb up
ip -n bench-ns link set lo up
# The XDP side gets frames as the sender built them: checksums in software.
ip netns exec bench-ns ethtool -K bench-lb tx off >/dev/null
ip link set bench-la up
ping_json() { ip netns exec bench-ns taskset -c 0 "$PERF" udp-pingpong --target 10.98.0.2:7 \
    --count "$PINGS" --warmup 1000 --size 64 --json 2>/dev/null | tail -1; }
: >"$WORK/lat"
for r in $(seq "$RUNS"); do
    "$DP" --lcores 1 --vdev net_af_xdp0,iface=bench-la --ip 10.98.0.2/24 --udp-echo 7 --idle busy \
        --stats-period 0 --duration 600 >/dev/null 2>&1 &
    dp_pid=$!
    sleep 3
    a=$(ping_json)
    kill -INT $dp_pid; wait $dp_pid 2>/dev/null || true
    ip addr add 10.98.0.2/24 dev bench-la
    taskset -c 1 "$PERF" udp-echo --bind 10.98.0.2:7 --idle busy --duration 600 >/dev/null 2>&1 &
    k_pid=$!
    sleep 1
    ip netns exec bench-ns ip neigh flush dev bench-lb
    k=$(ping_json)
    kill -INT $k_pid; wait $k_pid 2>/dev/null || true
    ip addr del 10.98.0.2/24 dev bench-la
    ip netns exec bench-ns ip neigh flush dev bench-lb
    for q in p50_us p99_us p999_us; do
        echo "af_xdp $q $(field "$a" $q)" >>"$WORK/lat"
        echo "kernel $q $(field "$k" $q)" >>"$WORK/lat"
    done
    echo "run $r: ainftp af_xdp p50/p99/p999 $(field "$a" p50_us)/$(field "$a" p99_us)/$(field "$a" p999_us) us;" \
        "kernel UDP $(field "$k" p50_us)/$(field "$k" p99_us)/$(field "$k" p999_us) us"
done
for q in p50_us p99_us p999_us; do
    a=$(awk -v q=$q '$1=="af_xdp" && $2==q {print $3}' "$WORK/lat" | median)
    k=$(awk -v q=$q '$1=="kernel" && $2==q {print $3}' "$WORK/lat" | median)
    awk -v q=$q -v a="$a" -v k="$k" 'BEGIN {printf "median %s: ainftp af_xdp %.1f us, kernel UDP %.1f us, ratio (kernel/ainftp) %.2f\n", q, a, k, (a>0 ? k/a : 0)}'
done
