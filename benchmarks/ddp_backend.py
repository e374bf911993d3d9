"""torch DDP step time on backend="collectives" against backend="gloo", same run, ratio printed.

One world per ``--world-size``; in it, the default group uses our backend and a
second group of the same ranks uses gloo. Two copies of torch's
``DistributedDataParallel`` around the MNIST net, one per group, are timed in
interleaved rounds (the order rotates each round), so that load from elsewhere on
the machine hits both alike. A step is zero_grad, forward, backward (DDP's
bucketed all_reduce) and ``optimizer.step()``. Rank 0 prints, nccl-tests style,
one row per world size: milliseconds per step (median over rounds of the
slowest rank's mean), and the ratio collectives/gloo (median of per-round
ratios; the goal is <= 1.05)::

    python -m benchmarks.ddp_backend --world-size 2,4 -n 20 -w 5
    python -m benchmarks.ddp_backend --world-size 4 --algo all_reduce:ring

``--algo`` is passed as ``COLLECTIVES_ALGO`` (default: the automatic choice).
``--world-size``, ``-n``, ``-w``, ``--threads`` and ``--timeout`` are the flags every
benchmark takes (``benchmarks.common``).
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import collectives  # noqa: F401  (registers the "collectives" backend)
from benchmarks import common
from collectives.tools import launch
from collectives.train.models import Net


def _round(model, opt, x, y, steps, group):
    """Mean seconds per step over ``steps``, the slowest rank's."""
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    took = torch.tensor([(time.perf_counter() - start) / steps], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX, group=group)
    return took.item()


def _worker(args):
    rank, _, world, _ = launch.place()
    torch.set_num_threads(args.threads)
    os.environ["COLLECTIVES_TIMEOUT"] = str(args.timeout)
    if args.algo:
        os.environ["COLLECTIVES_ALGO"] = args.algo
    dist.init_process_group("collectives", init_method="env://", rank=rank, world_size=world)
    try:
        gloo = dist.new_group(list(range(world)), backend="gloo")
        torch.manual_seed(rank)
        x, y = torch.randn(args.batch_size, 1, 28, 28), torch.randint(0, 10, (args.batch_size,))
        runs = {}
        for name, group in (("gloo", gloo), ("collectives", None)):
            torch.manual_seed(0)
            model = DDP(Net(), process_group=group, bucket_cap_mb=args.bucket_cap_mb)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            _round(model, opt, x, y, args.warmup_iters, gloo)
            runs[name] = (model, opt, [])
        names = list(runs)
        for r in range(args.iters):
            for name in names[r % 2:] + names[:r % 2]:
                model, opt, times = runs[name]
                times.append(_round(model, opt, x, y, args.steps, gloo))
        if rank == 0:
            ours, theirs = runs["collectives"][2], runs["gloo"][2]
            ratio = statistics.median(a / b for a, b in zip(ours, theirs))
            print(f"{world:>6d} {args.batch_size:>6d} {1e3 * statistics.median(theirs):>10.3f} "
                  f"{1e3 * statistics.median(ours):>12.3f} {ratio:>7.3f}", flush=True)
    finally:
        dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.ddp_backend", description=__doc__.split("\n")[0])
    common.add_timing_flags(p, n=20, w=5)   # -n: timed rounds per backend; -w: untimed steps first
    common.add_world_flags(p, default="2,4", backend=False)
    p.add_argument("--steps", type=common.whole(1), default=5, help="steps per timed round")
    p.add_argument("--batch-size", type=common.whole(1), default=32, help="examples per rank per step")
    p.add_argument("--bucket-cap-mb", type=common.positive("MiB"), default=25, help="DDP's bucket size")
    p.add_argument("--algo", default="", help='COLLECTIVES_ALGO, e.g. "all_reduce:ring" (default: auto)')
    args = common.finish_parsing(p, p.parse_args(argv))
    print(f"# torch DDP, MNIST net, {args.iters} rounds x {args.steps} steps after {args.warmup_iters} warm-up "
          f"steps; COLLECTIVES_ALGO={args.algo or '(auto)'}")
    print(f"# {'N':>4s} {'batch':>6s} {'gloo ms':>10s} {'collectives':>12s} {'ratio':>7s}")
    for n in args.world_size:   # one world each (under torchrun: torchrun's, in this process)
        if launch.run_job(_worker, n, (args,), lab=args.lab) != 0:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
