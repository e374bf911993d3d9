"""Per-step time of our data parallelism against torch's DistributedDataParallel.

Same model (the MNIST net), same per-rank batch, same world size, same
processes: every variant runs in each worker, in interleaved rounds so that
load from elsewhere on the machine hits all of them alike, and rank 0 prints
the median milliseconds per training step and the ratio to DDP::

    python -m collectives.bench_dp --world-sizes 2 4

Variants: ``DataParallel`` (bucketed, async, overlapped), ``NaiveDataParallel``
(one all_reduce per parameter after backward, the tutorial), torch ``DDP``
on gloo, and ``DDP`` with :func:`collectives.ddp_comm_hook`. A step is
zero_grad, forward, backward (with gradient averaging) and ``optimizer.step()``.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from . import api, launch
from .data_parallel import DataParallel
from .data_parallel_naive import NaiveDataParallel
from .ddp_hook import ddp_comm_hook
from .models import Net


def _variants(args):
    def ddp_hooked():
        model = torch.nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=args.bucket_cap_mb)
        model.register_comm_hook(state=None, hook=ddp_comm_hook(args.algorithm))
        return model
    return {
        "DDP (torch, gloo)": lambda: torch.nn.parallel.DistributedDataParallel(
            Net(), bucket_cap_mb=args.bucket_cap_mb),
        "DataParallel (ours, bucketed)": lambda: DataParallel(
            Net(), bucket_cap_mb=args.bucket_cap_mb, algorithm=args.algorithm),
        "NaiveDataParallel (ours)": lambda: NaiveDataParallel(Net(), algorithm=args.algorithm),
        "DDP + ddp_comm_hook (ours)": ddp_hooked,
    }


def _time_steps(model, opt, x, y, steps):
    api.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    api.barrier()
    return (time.perf_counter() - t0) / steps


def _worker(args):
    with launch.gloo_group() as (rank, world):
        torch.manual_seed(rank)
        x, y = torch.randn(args.batch_size, 1, 28, 28), torch.randint(0, 10, (args.batch_size,))
        runs = {}
        for name, make in _variants(args).items():
            torch.manual_seed(0)
            model = make()
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            _time_steps(model, opt, x, y, args.warmup)
            runs[name] = (model, opt, [])
        names = list(runs)
        for r in range(args.rounds):
            # Rotate who goes first, so no variant always runs right after another.
            for name in names[r % len(names):] + names[:r % len(names)]:
                model, opt, times = runs[name]
                times.append(_time_steps(model, opt, x, y, args.steps))
        if rank == 0:
            # Each round times every variant back to back; the ratio is taken within a
            # round (so a burst of load from elsewhere hits both sides), then the median.
            base = runs["DDP (torch, gloo)"][2]
            print(f"world size {world}, {args.batch_size} examples per rank, {args.rounds} rounds "
                  f"of {args.steps} steps; ms/step median (best), ratio to DDP median of rounds:")
            for name, (_, _, times) in runs.items():
                ratio = statistics.median(t / b for t, b in zip(times, base))
                print(f"  {name:30s} {1e3 * statistics.median(times):8.2f} ({1e3 * min(times):6.2f}) "
                      f"ms/step   {ratio:5.2f}x DDP", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m collectives.bench_dp", description=__doc__.split("\n")[0])
    p.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--batch-size", type=int, default=32, help="examples per rank per step")
    p.add_argument("--steps", type=int, default=10, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--algorithm", default=None, help="all_reduce algorithm (default: by size)")
    args = p.parse_args(argv)
    launch.launch_each(_worker, args.world_sizes, (args,))


if __name__ == "__main__":
    main()
