"""torch's ``_time_estimator`` on backend "collectives" against the measured time, same run.

For each world size and size, rank 0 prints our estimate (``_time_estimator``: the cost
model on the parameters of the tables the group agreed on, nothing sent) beside the
measured time of the same ``dist.all_reduce`` on the same group, and their ratio
estimate/measured. Measured as nccl-tests and ``benchmarks.tune`` time a call: the median
over ``-n`` rounds of the slowest rank's time per call of ``--batch`` calls back to back
(up to 32 for small sizes), after ``-w`` untimed rounds; beside it, a lone call after a
barrier (which adds the skew of the ranks leaving the barrier: with more ranks than cores,
milliseconds). A line per world size counts the cells within +-25% of each (the goal: at
least 80% of them, on a quiet machine)::

    python -m benchmarks.time_estimate                               # N=2,3,4, 1K..64M
    python -m benchmarks.time_estimate --world-size 2 -b 1K -e 1M -n 5

``--algo`` is passed as ``COLLECTIVES_ALGO`` (default: the automatic choice, which the
estimate prices too). ``--world-size``, ``-n``, ``-w``, ``--threads`` and ``--timeout`` are
the flags every benchmark takes (``benchmarks.common``).
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import collectives  # noqa: F401  (registers the "collectives" backend)
from benchmarks import common
from collectives.tools import launch

TOLERANCE = 0.25


def _timed(x, iters, batch=1):
    """The slowest rank's seconds per all_reduce, for each of ``iters`` rounds of ``batch``
    calls back to back, each round after a barrier."""
    times = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(batch):
            dist.all_reduce(x)
        took = torch.tensor([(time.perf_counter() - start) / batch], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        times.append(took.item())
    return times


def _worker(args):
    rank, _, world, _ = launch.place()
    torch.set_num_threads(args.threads)
    os.environ["COLLECTIVES_TIMEOUT"] = str(args.timeout)
    if args.algo:
        os.environ["COLLECTIVES_ALGO"] = args.algo
    dist.init_process_group("collectives", init_method="env://", rank=rank, world_size=world)
    try:
        within = within_lone = 0
        for size in args.sizes:
            x = torch.ones(max(size // 4, 1))
            with dist.distributed_c10d._time_estimator(device=torch.device("cpu")) as cm:
                dist.all_reduce(x)
            estimate = cm.estimated_time * 1e-6          # microseconds, as NCCL's
            batch = common.batch_for(x.numel() * 4, args.batch)
            _timed(x, args.warmup_iters, batch)
            measured = statistics.median(_timed(x, args.iters, batch))
            lone = statistics.median(_timed(x, args.iters))
            if rank == 0:
                print(f"{world:>6d} {common.human(x.numel() * 4):>8s} {1e6 * estimate:>12.1f} "
                      f"{1e6 * measured:>12.1f} {estimate / measured:>7.2f} {1e6 * lone:>10.1f} "
                      f"{estimate / lone:>7.2f}", flush=True)
            within += abs(estimate / measured - 1) <= TOLERANCE
            within_lone += abs(estimate / lone - 1) <= TOLERANCE
        if rank == 0:
            print(f"# N={world}: {within} of {len(args.sizes)} cells within +-{TOLERANCE:.0%} of calls back "
                  f"to back, {within_lone} of a lone call; load average {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.time_estimate", description=__doc__.split("\n")[0])
    common.add_timing_flags(p, n=10, w=2)
    common.add_size_flags(p, b="1K", e="64M", f=4)
    common.add_world_flags(p, default="2,3,4", backend=False)
    p.add_argument("--batch", type=common.whole(0), default=0,
                   help="calls back to back per round (0: as benchmarks.tune and the sweep time them, "
                        "up to 32 for small sizes)")
    p.add_argument("--algo", default="", help='COLLECTIVES_ALGO, e.g. "all_reduce:ring" (default: auto)')
    args = common.finish_parsing(p, p.parse_args(argv))
    print(f"# all_reduce float32 on backend collectives, {args.iters} timed rounds after "
          f"{args.warmup_iters}; COLLECTIVES_ALGO={args.algo or '(auto)'}; load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"# {'N':>4s} {'size':>8s} {'estimate us':>12s} {'measured us':>12s} {'ratio':>7s} "
          f"{'lone us':>10s} {'ratio':>7s}")
    for n in args.world_size:
        if launch.run_job(_worker, n, (args,), lab=args.lab) != 0:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
