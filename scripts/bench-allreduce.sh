#!/usr/bin/env bash
# ainftp-perf allreduce (QUIC over kernel UDP) against torch.distributed
# Gloo (TCP) on this host: same ranks, same sizes, same inputs and timing,
# runs alternating, medians printed with the ratio.
#   RUNS=3 RANKS="2 4" MINBYTES=4 MAXBYTES=64M FACTOR=4 ITERS=10 WARMUP=3
#   CODECS="f32 i16" PAYLOAD=1472 ./scripts/bench-allreduce.sh
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
PAYLOAD=${PAYLOAD:-1472}
PY=/usr/bin/python3   # Debian's python3-torch (scripts/setup-host.sh)

if ! "$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
    echo "bench-allreduce: torch with Gloo is missing: run scripts/setup-host.sh (python3-torch)" >&2
    exit 1
fi
cargo build --release -j1 -p tools >&2
PERF=target/release/ainftp-perf
OUT=$(mktemp -d /tmp/bench-allreduce.XXXXXX)
flags=(-b "$MINBYTES" -e "$MAXBYTES" -f "$FACTOR" -n "$ITERS" -w "$WARMUP")

echo "# host: $(nproc) cores, $(uname -r); torch $("$PY" -c 'import torch; print(torch.__version__)'); results in $OUT" >&2
for ranks in $RANKS; do
    for run in $(seq "$RUNS"); do
        for codec in $CODECS; do
            echo "# ranks=$ranks run=$run ainftp codec=$codec" >&2
            "$PERF" allreduce --local-ranks "$ranks" --transport udp --codec "$codec" \
                --udp-payload "$PAYLOAD" "${flags[@]}" --json > "$OUT/ainftp-$ranks-$codec-$run.jsonl"
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
    name = os.path.basename(path)[:-len(".jsonl")]
    parts = name.split("-")
    tool, ranks = parts[0], int(parts[1])
    codec = parts[2] if tool == "ainftp" else "f32"
    for line in open(path):
        r = json.loads(line)
        runs.setdefault((tool, ranks, codec, r["bytes"]), []).append(r)

def med(rows, key):
    return statistics.median(r[key] for r in rows)

codecs = sorted({k[2] for k in runs if k[0] == "ainftp"})
print("| ranks | bytes | gloo time_us | gloo busbw GB/s | " + " | ".join(
    f"ainftp {c} time_us | ainftp {c} busbw GB/s | {c} speed-up" for c in codecs) + " | wrong |")
print("|" + "---|" * (5 + 3 * len(codecs)))
for ranks in sorted({k[1] for k in runs}):
    for size in sorted({k[3] for k in runs if k[1] == ranks}):
        g = runs.get(("gloo", ranks, "f32", size))
        if not g:
            continue
        cells = [str(ranks), str(size), f"{med(g, 'time_us'):.1f}", f"{med(g, 'busbw_GBs'):.4f}"]
        wrong = sum(r["wrong"] for r in g)
        for c in codecs:
            a = runs.get(("ainftp", ranks, c, size))
            if not a:
                cells += ["-", "-", "-"]
                continue
            wrong += sum(r["wrong"] for r in a)
            # Speed-up = Gloo time / ainftp time (>1: ainftp faster).
            cells += [f"{med(a, 'time_us'):.1f}", f"{med(a, 'busbw_GBs'):.4f}",
                      f"{med(g, 'time_us') / med(a, 'time_us'):.2f}x"]
        print("| " + " | ".join(cells) + f" | {wrong} |")
PY
