#!/usr/bin/env bash
# ainftp-perf allreduce (QUIC over kernel UDP, and over our DPDK stack on
# af_xdp veths) against torch.distributed Gloo (TCP) on this host: same
# ranks, same sizes, same inputs and timing, runs alternating, medians
# printed with the ratio (Gloo time / ainftp time: >1 means ainftp is faster).
#   RUNS=3 RANKS="2 4" MINBYTES=4 MAXBYTES=64M FACTOR=4 ITERS=10 WARMUP=3
#   CODECS="f32 i16" TRANSPORTS="udp dpdk" PAYLOAD=1472 LANES="1 4" ./scripts/bench-allreduce.sh
# PAYLOAD: UDP payload per datagram over kernel UDP; default: the route's
# MTU (loopback) capped at 32 KiB, ainftp-perf's own default.
# LANES: ainftp's lanes per rank (--lanes; each a thread on a CPU of its
# own while there are enough); default 1. Gloo runs as it is.
# PROGRESS: where ainftp's collectives progress (--progress caller|thread;
# default caller). OVERLAP_US: simulated computation per step, in us
# (--overlap-us; Gloo then uses async_op=True); time_us is the whole step.
# DTYPE: f32 or bf16 buffers for both (--dtype; Gloo widens bf16 to f32,
# as its users must: it cannot reduce bf16).
# PERF, PY: the ainftp-perf binary (default: built here) and the python
# with torch (default: Debian's), for hosts that have their own.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
RANKS=${RANKS:-"2 4"}
MINBYTES=${MINBYTES:-4}
MAXBYTES=${MAXBYTES:-64M}
FACTOR=${FACTOR:-4}
ITERS=${ITERS:-10}
WARMUP=${WARMUP:-3}
CODECS=${CODECS:-"f32 i16"}
TRANSPORTS=${TRANSPORTS:-"udp dpdk"}
PAYLOAD=${PAYLOAD:-}
LANES=${LANES:-1}
PROGRESS=${PROGRESS:-caller}
OVERLAP_US=${OVERLAP_US:-0}
DTYPE=${DTYPE:-f32}
PY=${PY:-/usr/bin/python3}   # Debian's python3-torch (scripts/setup-host.sh)

if ! "$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
    echo "bench-allreduce: torch with Gloo is missing: run scripts/setup-host.sh (python3-torch)" >&2
    exit 1
fi
if [ -z "${PERF:-}" ]; then
    cargo build --release -j1 -p tools >&2
    PERF=target/release/ainftp-perf
fi
OUT=$(mktemp -d /tmp/bench-allreduce.XXXXXX)
flags=(-b "$MINBYTES" -e "$MAXBYTES" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" --overlap-us "$OVERLAP_US" --dtype "$DTYPE")
payload=()
if [ -n "$PAYLOAD" ]; then payload=(--udp-payload "$PAYLOAD"); fi

echo "# host: $(nproc) cores, $(uname -r); torch $("$PY" -c 'import torch; print(torch.__version__)'); results in $OUT" >&2
for ranks in $RANKS; do
    for run in $(seq "$RUNS"); do
        for transport in $TRANSPORTS; do
            for codec in $CODECS; do
                for lanes in $LANES; do
                    for progress in $PROGRESS; do
                        echo "# ranks=$ranks run=$run ainftp transport=$transport codec=$codec lanes=$lanes progress=$progress" >&2
                        # libbpf's notes on stderr (af_xdp) go to a log.
                        # --udp-payload is kernel UDP's; on DPDK the links' MTU sets it.
                        [ "$transport" = udp ] && tp=("${payload[@]}") || tp=()
                        "$PERF" allreduce --local-ranks "$ranks" --transport "$transport" --codec "$codec" \
                            --lanes "$lanes" --progress "$progress" "${tp[@]}" "${flags[@]}" --json \
                            > "$OUT/ainftp_$transport-$ranks-$codec-$run-$lanes-$progress.jsonl" 2>>"$OUT/stderr.log" ||
                            { echo "bench-allreduce: ainftp-perf failed:" >&2; tail -5 "$OUT/stderr.log" >&2; exit 1; }
                    done
                done
            done
        done
        echo "# ranks=$ranks run=$run gloo" >&2
        "$PY" scripts/gloo_allreduce.py --local-ranks "$ranks" "${flags[@]}" --json \
            > "$OUT/gloo-$ranks-$run.jsonl"
    done
done

"$PY" - "$OUT" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
runs = {}
for path in glob.glob(os.path.join(out, "*.jsonl")):
    tool, ranks, *rest = os.path.basename(path)[:-len(".jsonl")].split("-")
    variant = "gloo" if tool == "gloo" else tool.split("_")[1] + " " + rest[0]
    if tool != "gloo" and rest[2] != "1":
        variant += f" x{rest[2]} lanes"
    if tool != "gloo" and rest[3] != "caller":
        variant += f" ({rest[3]})"
    for line in open(path):
        r = json.loads(line)
        runs.setdefault((variant, int(ranks), r["bytes"]), []).append(r)

def med(rows, key):
    return statistics.median(r[key] for r in rows)

def bw(rows):
    """Median busbw; none with OVERLAP_US, where time_us is the whole step."""
    vals = [r["busbw_GBs"] for r in rows]
    return "-" if None in vals else f"{statistics.median(vals):.4f}"

variants = sorted({k[0] for k in runs if k[0] != "gloo"})
print("| ranks | bytes | ainftp | time_us | busbw GB/s | gloo time_us | gloo busbw GB/s | speed-up | wrong |")
print("|---|---|---|---|---|---|---|---|---|")
for ranks in sorted({k[1] for k in runs}):
    for size in sorted({k[2] for k in runs if k[1] == ranks}):
        g = runs.get(("gloo", ranks, size))
        if not g:
            continue
        for v in variants:
            a = runs.get((v, ranks, size))
            if not a:
                continue
            wrong = sum(r["wrong"] for r in a + g)
            print(f"| {ranks} | {size} | {v} | {med(a, 'time_us'):.1f} | {bw(a)} | "
                  f"{med(g, 'time_us'):.1f} | {bw(g)} | "
                  f"{med(g, 'time_us') / med(a, 'time_us'):.2f}x | {wrong} |")
PY
