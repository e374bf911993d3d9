"""Exposed communication with and without overlap: tensor parallelism's chunked collectives, FSDP's
prefetched gathers and asynchronous reduce-scatters.

Usage::

    python -m benchmarks.overlap                              # 2 ranks, both cases, traces in ./overlap_*.json
    python -m benchmarks.overlap --world-size 4 --steps 8 --chunks 4 --trace-dir /tmp

Two cases, each run both ways in the same world, steps interleaved so load from
other jobs falls on both alike:

* **tp**: one sequence-parallel transformer block (:class:`ParallelBlock`, float32,
  S x B x H = ``--seq`` x 4 x ``--hidden``), ``overlap=1`` (one chunk, waited for at once)
  against ``overlap=--chunks``;
* **fsdp**: ``--layers`` Linear(``--width``) layers under ``FullyShardedDataParallel``,
  gather on use and a blocking reduce-scatter (``prefetch=False``) against prefetch and
  ``overlap_reduce_scatter=True``.

*Exposed* communication is the time the computing thread spends waiting for messages
(the waits the layers record: ``exposed_waits`` for tensor parallelism, ``model.waits``
for FSDP), per step, median over ``--steps`` after one warm-up step, largest over
ranks. The rest of a step is arithmetic or Python. Each case writes one Perfetto trace
per way (``overlap_tp_off.json``, ``overlap_tp_on.json``, ...): every message, every
collective call, and on the "program" track each step and each wait.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from benchmarks import common
from collectives.parallel.fsdp import FullyShardedDataParallel
from collectives.parallel.tensor_parallel import Block, ParallelBlock, exposed_waits, reduce_replicated_grads
from collectives.tools import perfetto


def tp_case(args, rank, n, overlap):
    torch.manual_seed(0)
    model = ParallelBlock(Block(args.hidden, 8, 4 * args.hidden), None, True, overlap=overlap)
    waits = exposed_waits(model)
    x = torch.randn(args.seq // n, 4, args.hidden, generator=torch.Generator().manual_seed(rank))

    def step():
        model.zero_grad()
        model(x).pow(2).mean().backward()
        reduce_replicated_grads(model)
    return step, waits


def fsdp_case(args, rank, n, overlap):
    torch.manual_seed(0)
    model = FullyShardedDataParallel([nn.Linear(args.width, args.width) for _ in range(args.layers)],
                                     prefetch=overlap, overlap_reduce_scatter=overlap)
    x = torch.randn(args.rows, args.width, generator=torch.Generator().manual_seed(rank))

    def step():
        model.zero_grad()
        model(x).pow(2).mean().backward()
    return step, model.waits


CASES = {"tp": tp_case, "fsdp": fsdp_case}


def worker(args, rank, n, device):
    rows = []
    # tp off: one chunk, its collective waited for at once, so its waits are recorded too
    on_off = {"tp": (1, args.chunks), "fsdp": (False, True)}
    for case in args.case:
        built = {way: CASES[case](args, rank, n, on_off[case][way == "on"])
                 for way in ("off", "on")}
        times = {way: [] for way in built}
        for i in range(args.steps + 1):
            for way, (step, waits) in built.items():
                del waits[:]
                dist.barrier()
                t = time.time()
                step()
                if i:                              # step 0 warms up: connections, allocator
                    times[way].append((time.time() - t, sum(e - s for s, e in waits)))
        for way, (step, waits) in built.items():
            dist.barrier()
            del waits[:]
            with collectives.trace() as records:
                t = time.time()
                step()
                spans = [(rank, "step", t, time.time())] + [(rank, "wait", s, e) for s, e in waits]
            everyone = [None] * n
            dist.all_gather_object(everyone, (list(records), spans))   # a trace's data, not a lesson
            if rank == 0:
                perfetto.export_chrome_trace([r for recs, _ in everyone for r in recs],
                                             os.path.join(args.trace_dir, f"overlap_{case}_{way}.json"),
                                             spans=[s for _, sp in everyone for s in sp])
            med = torch.tensor([statistics.median(s for s, _ in times[way]),
                                statistics.median(w for _, w in times[way])], dtype=torch.float64)
            collectives.all_reduce(med, op=collectives.ReduceOp.MAX)
            rows.append((case, way, *med.tolist()))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_world_flags(parser, default="2", backend=False)
    parser.add_argument("--case", choices=sorted(CASES), action="append", help="tp, fsdp (default both)")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per way (after one warm-up)")
    parser.add_argument("--chunks", type=int, default=4, help="tensor parallelism's overlap=")
    parser.add_argument("--seq", type=int, default=256, help="tp: sequence length (divisible by N x chunks)")
    parser.add_argument("--hidden", type=int, default=256, help="tp: hidden width (ffn 4x, 8 heads)")
    parser.add_argument("--layers", type=int, default=8, help="fsdp: Linear layers")
    parser.add_argument("--width", type=int, default=512, help="fsdp: their width")
    parser.add_argument("--rows", type=int, default=256, help="fsdp: batch rows per rank")
    parser.add_argument("--trace-dir", default=".", help="where the Perfetto traces go")
    args = common.finish_parsing(parser, parser.parse_args(argv))
    args.case = args.case or ["tp", "fsdp"]
    for n, rows in common.run_worlds(worker, args):
        print(f"# N = {n}; ms per step, median of {args.steps}, largest over ranks; "
              f"tp: seq {args.seq} x batch 4 x hidden {args.hidden}, overlap={args.chunks}; "
              f"fsdp: {args.layers} x Linear({args.width}), {args.rows} rows")
        print(f"{'case':>5} {'overlap':>8} {'step':>8} {'exposed comm':>13} {'exposed share':>14}")
        for case, way, step_s, exposed_s in rows:
            print(f"{case:>5} {way:>8} {step_s * 1e3:8.1f} {exposed_s * 1e3:13.1f} {exposed_s / step_s:14.0%}")
        print(f"traces: {', '.join(os.path.join(args.trace_dir, f'overlap_{c}_{w}.json') for c in args.case for w in ('off', 'on'))}")


if __name__ == "__main__":
    main()
