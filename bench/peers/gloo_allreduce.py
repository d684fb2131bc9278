#!/usr/bin/env python3
"""gloo_allreduce.py: PyTorch's gloo allreduce timed as bench_allreduce times flint's, for its
peer rows. Started by bench_allreduce:

    python3 gloo_allreduce.py --ranks P BYTES:SAMPLES [BYTES:SAMPLES ...]

Starts P processes joined by torch.distributed (backend gloo, TCP over loopback). For each
size: one untimed allreduce, then SAMPLES samples of barrier + all_reduce (fp32, sum) timed on
every rank; a sample's time is the slowest rank's, and rank 0 prints the median as one JSON
line: {"peer": "gloo", "transport": "tcp", "ranks": P, "bytes": B, "latency_us": T}.
Exit 1 on a failure, 2 when torch.distributed or gloo is missing.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time


def rank_main(rank, size, port, sizes, out):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size)
    buf = torch.zeros(max(b for b, _ in sizes) // 4, dtype=torch.float32)
    for nbytes, samples in sizes:
        t = buf[: nbytes // 4]
        dist.all_reduce(t)
        times = torch.zeros(samples, dtype=torch.float64)
        for s in range(samples):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times[s] = time.perf_counter() - t0
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        if rank == 0:
            out.put({"peer": "gloo", "transport": "tcp", "ranks": size, "bytes": nbytes,
                     "latency_us": round(statistics.median(times.tolist()) * 1e6, 2)})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("sizes", nargs="+")
    a = ap.parse_args()
    try:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_gloo_available():
            raise ImportError("torch.distributed without gloo")
    except ImportError as e:
        print(f"gloo_allreduce: {e}", file=sys.stderr)
        return 2
    sizes = []
    for s in a.sizes:
        b, n = s.split(":")
        sizes.append((int(b), int(n)))
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, a.ranks, port, sizes, out)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    rows = []
    # Rows arrive as rank 0 finishes each size; a rank that dies ends the wait.
    while len(rows) < len(sizes):
        try:
            rows.append(out.get(timeout=1.0))
        except Exception:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            if all(p.exitcode == 0 for p in procs) and out.empty():
                break
    for p in procs:
        p.join()
    for r in rows:
        print(json.dumps(r), flush=True)
    return 0 if len(rows) == len(sizes) and all(p.exitcode == 0 for p in procs) else 1


if __name__ == "__main__":
    sys.exit(main())
