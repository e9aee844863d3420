#!/usr/bin/python3
"""torch.distributed (Gloo) all-reduce with ainftp-perf's flags and columns.

The peer of `ainftp-perf allreduce` in scripts/bench-allreduce.sh: same
inputs (rank r, element i: ((7i + 13r) mod 64) / 4 - 8), same timing
(fresh input before each iteration, only the collective timed), same
columns, one JSON object per size with --json.

    gloo_allreduce.py --local-ranks 4 -b 8 -e 64M -f 4 -n 10 -w 3 [--json]

--overlap-us N (as ainftp-perf's): each timed iteration starts the
all-reduce (async_op=True: Gloo runs it on its own threads), sleeps N us as
a CPU waiting on its GPU would, then waits for it; time_us is the whole step.

--dtype bf16: the buffers are bfloat16. This torch's Gloo cannot reduce
bf16 ("Invalid scalar type"), so, as a Gloo user must, each timed iteration
widens to f32, all-reduces that, and rounds the result back to bf16.
"""

import argparse
import json
import os
import socket
import sys
import time


def parse_bytes(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip()
    if s and s[-1].lower() in mult:
        return int(s[:-1]) * mult[s[-1].lower()]
    return int(s)


def values(torch, rank, count):
    i = torch.arange(count, dtype=torch.int64)
    return ((i * 7 + rank * 13) % 64).to(torch.float32) * 0.25 - 8.0


def bw(gbs):
    return "-" if gbs is None else f"{gbs:.4f}"


def all_reduce(dist, buf, op, dtype_bf16, async_op):
    """The all-reduce a Gloo user runs on `buf`; a handle when async_op."""
    if not dtype_bf16:
        return dist.all_reduce(buf, op=op, async_op=async_op)
    wide = buf.float()
    work = dist.all_reduce(wide, op=op, async_op=async_op)

    class Narrowed:
        def wait(self):
            if work is not None:
                work.wait()
            buf.copy_(wide)

    done = Narrowed()
    if not async_op:
        done.wait()
    return done


def rank_main(rank, world, port, args, out):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # The same placement as ainftp-perf --local-ranks: rank r on the r-th
    # allowed CPU, round robin (threads Gloo starts later inherit it).
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    op = ops[args.op]
    size = args.minbytes
    while size <= args.maxbytes:
        bf16 = args.dtype == "bf16"
        count = size // (2 if bf16 else 4)
        inp = values(torch, rank, count)
        if bf16:
            inp = inp.to(torch.bfloat16)  # multiples of 1/4 in [-8, 8): exact
        buf = inp.clone()
        for _ in range(args.warmup_iters):
            buf.copy_(inp)
            all_reduce(dist, buf, op, bf16, False)
        total = 0.0
        compute = args.overlap_us / 1e6
        for _ in range(args.iters):
            buf.copy_(inp)
            t = time.perf_counter()
            if compute > 0:
                work = all_reduce(dist, buf, op, bf16, True)
                time.sleep(compute)
                work.wait()
            else:
                all_reduce(dist, buf, op, bf16, False)
            total += time.perf_counter() - t
        stacked = torch.stack([values(torch, r, count) for r in range(world)])
        if args.op == "sum":
            ref = stacked.sum(0)
        elif args.op == "max":
            ref = stacked.max(0).values
        else:
            ref = stacked.min(0).values
        got = buf.float()
        err = (got - ref).abs()
        rel = err / ref.abs().clamp(min=1.0)
        # bf16: one rounding of the result, 2^-8 of its magnitude (as ainftp-perf).
        tol = 1e-6 * ref.abs().clamp(min=1.0)
        if bf16:
            tol = tol + (ref.abs() + tol) / 256
        wrong = int((err > tol).sum())
        secs = total / args.iters
        # With --overlap-us time_us is the whole step: no bandwidth (null).
        algbw = size / secs / 1e9 if args.overlap_us == 0 else None
        row = {
            "mode": "allreduce",
            "ranks": world,
            "bytes": size,
            "count": count,
            "type": "bfloat16" if bf16 else "float",
            "codec": "f32",
            "op": args.op,
            "algo": "gloo",
            "time_us": secs * 1e6,
            "algbw_GBs": algbw,
            "busbw_GBs": algbw * 2 * (world - 1) / world if algbw is not None else None,
            "max_rel_err": float(rel.max()) if count else 0.0,
            "wrong": wrong,
            "progress": "thread",
            "overlap_us": args.overlap_us,
        }
        if rank == 0:
            if args.json:
                print(json.dumps(row), file=out, flush=True)
            else:
                print(
                    f"  {size:>12} {count:>10} {row['type']:>8} {'f32':>5} {args.op:>4} {'gloo':>6} "
                    f"{row['time_us']:>11.1f} {bw(algbw):>10} {bw(row['busbw_GBs']):>10} "
                    f"{row['max_rel_err']:>11.2e} {wrong:>6}",
                    file=out,
                    flush=True,
                )
        size *= args.stepfactor
    dist.barrier()
    dist.destroy_process_group()


def child(rank, world, port, args):
    rank_main(rank, world, port, args, sys.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local-ranks", type=int, required=True)
    p.add_argument("-b", "--minbytes", type=parse_bytes, default=parse_bytes("8"))
    p.add_argument("-e", "--maxbytes", type=parse_bytes, default=parse_bytes("32M"))
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup-iters", type=int, default=5)
    p.add_argument("--op", choices=["sum", "max", "min"], default="sum")
    p.add_argument("--overlap-us", type=int, default=0)
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = args.local_ranks
    if not args.json:
        print(f"# torch {__import__('torch').__version__} Gloo allreduce: {world} ranks, "
              f"{args.warmup_iters} warmup + {args.iters} timed iterations")
        print(f"# {'size':>12} {'count':>10} {'type':>6} {'codec':>5} {'op':>4} {'algo':>6} "
              f"{'time_us':>11} {'algbw_GBs':>10} {'busbw_GBs':>10} {'max_rel_err':>11} {'wrong':>6}")
        sys.stdout.flush()
    mp.start_processes(child, args=(world, port, args), nprocs=world, start_method="fork")


if __name__ == "__main__":
    main()
