"""Per-step time of our data parallelism against torch's DistributedDataParallel.

Same model (the MNIST net), same per-rank batch, same world size, same
processes: every variant runs in each worker, in interleaved rounds so that
load from elsewhere on the machine hits all of them alike, and rank 0 prints
the median milliseconds per training step and the ratio to DDP::

    python -m benchmarks.data_parallel --world-size 2,4

Variants: ``DataParallel`` (bucketed, async, overlapped), ``NaiveDataParallel``
(one all_reduce per parameter after backward, the tutorial), torch ``DDP``
on gloo, and ``DDP`` with :func:`collectives.ddp_comm_hook`. A step is
zero_grad, forward, backward (with gradient averaging) and ``optimizer.step()``.
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks import common
from collectives import api
from collectives.data_parallel import DataParallel
from collectives.data_parallel_naive import NaiveDataParallel
from collectives.ddp_hook import ddp_comm_hook
from collectives.models import Net


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


def _worker(args, rank, world, device):
    torch.manual_seed(rank)
    x, y = torch.randn(args.batch_size, 1, 28, 28), torch.randint(0, 10, (args.batch_size,))
    runs = {}
    for name, make in _variants(args).items():
        torch.manual_seed(0)
        model = make()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        _time_steps(model, opt, x, y, args.warmup_iters)
        runs[name] = (model, opt, [])
    names = list(runs)
    for r in range(args.rounds):
        # Rotate who goes first, so no variant always runs right after another.
        for name in names[r % len(names):] + names[:r % len(names)]:
            model, opt, times = runs[name]
            times.append(_time_steps(model, opt, x, y, args.iters))
    # Each round times every variant back to back; the ratio is taken within a
    # round (so a burst of load from elsewhere hits both sides), then the median.
    base = runs["DDP (torch, gloo)"][2]
    rows = [{"world_size": world, "variant": name, "ms_per_step": 1e3 * statistics.median(times),
             "best_ms_per_step": 1e3 * min(times),
             "vs_ddp": statistics.median(t / b for t, b in zip(times, base))}
            for name, (_, _, times) in runs.items()]
    if rank == 0:
        print(f"world size {world}, {args.batch_size} examples per rank, {args.rounds} rounds "
              f"of {args.iters} steps; ms/step median (best), ratio to DDP median of rounds:")
        for row in rows:
            print(f"  {row['variant']:30s} {row['ms_per_step']:8.2f} ({row['best_ms_per_step']:6.2f}) "
                  f"ms/step   {row['vs_ddp']:5.2f}x DDP", flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.data_parallel", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-n", "--iters", type=int, default=10, help="training steps per timed round")
    p.add_argument("-w", "--warmup-iters", type=int, default=5, help="untimed steps per variant first")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--algorithm", default=None, help="all_reduce algorithm (default: by size)")
    common.add_world_flags(p, default="2,4", backend=False)
    p.add_argument("--batch-size", type=int, default=32, help="examples per rank per step")
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--out", default=os.path.join(common.OUT_DIR, "data_parallel"))
    args = common.finish_parsing(p, p.parse_args(argv))
    meta = common.machine_info("python -m benchmarks.data_parallel", args)
    results = common.run_worlds(_worker, args)
    if results is not None:
        common.write_rows(args.out, "results", [r for _, rows in results for r in rows], meta)


if __name__ == "__main__":
    main()
