"""Work per rank of causal ring attention: the plain layout against zig-zag, measured.

Usage::

    python -m benchmarks.zigzag_balance                       # 4 ranks, S = 4096
    python -m benchmarks.zigzag_balance --world-size 2,4 --seq 2048 -n 3

Each rank runs forward and backward of one causal attention (1 x 4 heads x S x 64,
float32) on its part of the sequence: chunk r of N (``ring_attention``) or chunks r and
2N-1-r of 2N (``zigzag_ring_attention``). What is measured is the CPU time of each rank's
process over the call (``time.process_time``: every thread of the rank, the ring's
included; waiting for a message costs none), median of ``-n`` runs after ``-w`` warm-up
runs. The table prints each rank's CPU milliseconds, and the busiest rank over the mean
beside the model's score-entry count (``ring_attention_zigzag.work``): 2N/(N+1) for the
plain ring, 1 for zig-zag. The step's wall time follows the busiest rank.
"""
import argparse
import statistics
import time

import torch

import collectives
from benchmarks import common
from collectives.parallel.ring_attention import ring_attention
from collectives.parallel.ring_attention_zigzag import work, zigzag_ring_attention, zigzag_split

HEADS, D = 4, 64


def run(layout, q, k, v, n, r):
    cut = (lambda t: t.chunk(n, dim=2)[r]) if layout == "plain" else (lambda t: zigzag_split(t, n, r, dim=2))
    parts = [cut(t).clone().requires_grad_() for t in (q, k, v)]
    collectives.barrier()
    cpu, wall = time.process_time(), time.perf_counter()
    out = (zigzag_ring_attention if layout == "zigzag" else ring_attention)(*parts, causal=True)
    out.sum().backward()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu, wall


def worker(args, rank, n, device):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, args.seq, D, generator=g) for _ in range(3))
    rows = {}
    for layout in ("plain", "zigzag"):
        samples = [run(layout, q, k, v, n, rank) for _ in range(args.warmup_iters + args.iters)][args.warmup_iters:]
        mine = torch.tensor([statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)],
                            dtype=torch.float64)
        everyone = [torch.empty(2, dtype=torch.float64) for _ in range(n)]
        collectives.all_gather(everyone, mine)
        rows[layout] = [e.tolist() for e in everyone]
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_world_flags(parser, default="4")
    common.add_timing_flags(parser, n=3, w=1)
    parser.add_argument("--seq", type=int, default=4096, help="the whole sequence's length (divisible by 2N)")
    args = common.finish_parsing(parser, parser.parse_args(argv))
    for n in args.world_size:
        if args.seq % (2 * n):
            parser.error(f"--seq {args.seq} must be divisible by 2N = {2 * n}")
    print(f"# causal attention, 1 x {HEADS} heads x S={args.seq} x {D}, float32, forward + backward; "
          f"CPU ms per rank (median of {args.iters})")
    print(f"{'N':>3} {'layout':>7} {'CPU ms per rank':>32} {'busiest/mean':>13} {'model':>6} {'wall ms':>8}")
    for n, rows in common.run_worlds(worker, args):
        for layout, per_rank in rows.items():
            cpu = [c * 1e3 for c, _ in per_rank]
            model = work(n, zigzag=layout == "zigzag")
            print(f"{n:3d} {layout:>7} {' '.join(f'{c:7.1f}' for c in cpu):>32} "
                  f"{max(cpu) / statistics.mean(cpu):13.2f} {max(model) / statistics.mean(model):6.2f} "
                  f"{max(w for _, w in per_rank) * 1e3:8.1f}")


if __name__ == "__main__":
    main()
