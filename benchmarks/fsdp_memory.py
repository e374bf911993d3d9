"""Parameter memory per rank under fully sharded data parallel, against S/N + one layer.

Usage::

    python -m benchmarks.fsdp_memory                         # 8 layers of 1024x1024, N = 1, 2, 4
    python -m benchmarks.fsdp_memory --world-size 2,4,8 --layers 16 --width 512 --no-prefetch

The model is ``--layers`` Linear(width, width) layers (float32), S bytes of parameters,
trained one step on a batch of 4 rows per rank. ``FullyShardedDataParallel`` counts
the parameter bytes it holds (``param_bytes``: the bytes of its pieces plus the storage
of every gathered layer, read from the tensors themselves) at every gather; the
table shows, largest over ranks, what it holds at rest (between steps) and
at the peak of the step, beside S/N, S/N + one layer and S/N + two layers.

Why not the process's resident set: on a machine shared with other jobs the kernel
drops clean pages of torch's libraries from a process's resident set whenever memory
is short, which moved the figure by more than 100 MiB between runs here (the
high-water mark even fell below the starting point), far more than the model. The
tensors' own storage sizes do not move.
"""
import argparse

import torch
import torch.nn as nn

import collectives
from benchmarks import common
from collectives.parallel.fsdp import FullyShardedDataParallel

ROWS = 4


def layers(args):
    torch.manual_seed(0)
    return [nn.Linear(args.width, args.width) for _ in range(args.layers)]


def measure(args, n):
    model = FullyShardedDataParallel(layers(args), prefetch=not args.no_prefetch)
    rest = model.param_bytes()
    model.peak_bytes = 0
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model(torch.randn(ROWS, args.width)).pow(2).mean().backward()
    opt.step()
    return rest, model.peak_bytes, model.param_bytes()


def worker(args, rank, n, device):
    t = torch.tensor(measure(args, n), dtype=torch.float64)
    collectives.all_reduce(t, op=collectives.ReduceOp.MAX)
    return t.tolist()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_world_flags(parser, default="1,2,4", backend=False)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--no-prefetch", action="store_true", help="gather each layer only when it is used")
    args = common.finish_parsing(parser, parser.parse_args(argv))
    layer = (args.width * args.width + args.width) * 4
    s = layer * args.layers
    mib = 2 ** 20
    print(f"# {args.layers} layers of {args.width}x{args.width} float32: S = {s / mib:.1f} MiB, one layer "
          f"{layer / mib:.2f} MiB; prefetch {'off' if args.no_prefetch else 'on'}; MiB, largest over ranks")
    print(f"{'N':>3} {'params at rest':>15} {'S/N':>7} {'params peak':>12} {'S/N+1 layer':>12} "
          f"{'S/N+2 layers':>13} {'after the step':>15}")
    for n, (rest, peak, after) in common.run_worlds(worker, args):
        pieces = -(-(args.width * args.width + args.width) // n) * 4 * args.layers     # S/N, padded
        print(f"{n:3d} {rest / mib:15.2f} {pieces / mib:7.2f} {peak / mib:12.2f} "
              f"{(pieces + layer) / mib:12.2f} {(pieces + 2 * layer) / mib:13.2f} {after / mib:15.2f}")


if __name__ == "__main__":
    main()
