#!/usr/bin/env bash
# The QUIC interop runner's goodput case: one client, an implementation
# nobody here wrote (aioquic's, over kernel UDP, in a netns on CLIENT_CPU),
# downloads BYTES on one stream from a server at the other end of the same
# veth pair (on SERVER_CPU), checks them byte for byte and times them. The
# server is, in turn:
#   ours/dpdk: ainftp-perf quic-server on our DPDK stack (net_af_xdp on the
#              veth);
#   ours/udp:  the same server over kernel UDP sockets;
#   aioquic:   aioquic's own server (stack/tests/interop/aioquic_peer.py).
# Alternates the three RUNS times; prints medians and the ratios of ours to
# aioquic's. The client is aioquic in Python, so every row is bound by it
# as much as by the server: this measures what each server lets such a
# client reach, not the servers' own ceilings (scripts/bench-quic.sh has
# those). Needs root (veth, netns, hugepages) and aioquic
# (scripts/setup-host.sh).
#   RUNS=5 BYTES=50000000 ./scripts/bench-interop-goodput.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

RUNS=${RUNS:-5}
BYTES=${BYTES:-50000000}
CLIENT_CPU=${CLIENT_CPU:-0}
SERVER_CPU=${SERVER_CPU:-1}
PERF=${PERF:-target/release/ainftp-perf}
DP=${DP:-target/release/ainftp-dp}
PEER=stack/tests/interop/aioquic_peer.py
NS=bench-gns
SERVER_IP=10.97.0.2
WORK=
[ -x "$PERF" ] && [ -x "$DP" ] || cargo build --release -q -p tools

cleanup() { bench_teardown bench-ga $NS bg; }
trap cleanup EXIT
cleanup
WORK=$(mktemp -d /tmp/ainftp-bg.XXXXXX)
CERTS=$WORK/certs
"$DP" certs --dir "$CERTS" --ca --node server --node client >/dev/null

veth_ns_up $NS bench-ga bench-gb $SERVER_IP 10.97.0.1
# The kernel's veth leaves UDP checksums to offload that an XDP path does
# not have (see stack/tests/af_xdp.rs).
ip netns exec $NS ethtool -K bench-gb tx off >/dev/null

start_server() { # kind
    case $1 in
    dpdk)
        "$PERF" quic-server --transport dpdk --idle busy --vdev net_af_xdp0,iface=bench-ga \
            --ip $SERVER_IP/24 --lcores "$SERVER_CPU" --bind $SERVER_IP:4433 --certs "$CERTS" \
            --duration 600 -- --file-prefix bg-srv >/dev/null 2>&1 &
        srv=$! ;;
    udp)
        taskset -c "$SERVER_CPU" "$PERF" quic-server --transport udp --idle busy \
            --bind $SERVER_IP:4433 --certs "$CERTS" --duration 600 >/dev/null 2>&1 &
        srv=$! ;;
    aioquic)
        taskset -c "$SERVER_CPU" python3 "$PEER" server --host $SERVER_IP --port 4433 \
            --cert "$CERTS/server.pem" --key "$CERTS/server.key" --timeout 600 >/dev/null 2>&1 &
        srv=$! ;;
    esac
    sleep 3
}
stop_server() { kill -INT "$srv" 2>/dev/null || true; wait "$srv" 2>/dev/null || true; srv=; }

# Prints the client's goodput in Mbit/s, or nothing if the download failed.
download() {
    ip netns exec $NS taskset -c "$CLIENT_CPU" python3 "$PEER" client --host $SERVER_IP \
        --port 4433 --ca "$CERTS/ca.pem" --cert "$CERTS/client.pem" --key "$CERTS/client.key" \
        --download "$BYTES" --timeout 120 2>/dev/null | tail -1 |
        python3 -c "import json,sys; r=json.load(sys.stdin)['first']; print(r['goodput_mbps']) if r.get('download_exact') else None" || true
}

KINDS="dpdk udp aioquic"
for k in $KINDS; do : >"$WORK/$k"; done
for r in $(seq "$RUNS"); do
    line="run $r:"
    for k in $KINDS; do
        start_server $k
        g=$(download)
        stop_server
        [ -n "$g" ] && echo "$g" >>"$WORK/$k"
        line="$line $k ${g:-failed}"
    done
    echo "$line Mbit/s"
done
d=$(median <"$WORK/dpdk"); u=$(median <"$WORK/udp"); a=$(median <"$WORK/aioquic")
echo "median goodput of aioquic's client downloading $BYTES bytes: from ours over dpdk (af_xdp) $d Mbit/s, ours over kernel udp $u, aioquic's server $a"
awk -v d="$d" -v u="$u" -v a="$a" 'BEGIN {printf "ratios to aioquic'"'"'s server: ours/dpdk %.2f, ours/udp %.2f\n", (a>0?d/a:0), (a>0?u/a:0)}'
