"""Parameter memory per rank under fully sharded data parallel, against S/N + one layer.

Usage::

    python -m benchmarks.fsdp_memory                         # 8 layers of 1024x1024, N = 1, 2, 4
    python -m benchmarks.fsdp_memory --world-size 2,4,8 --layers 16 --width 512

The model is ``--layers`` Linear(width, width) layers (float32), S bytes of parameters,
trained on a batch of 4 rows per rank (activations are negligible beside the weights).
Two measures per rank, the largest over ranks shown:

* **parameters held**, counted by ``FullyShardedDataParallel.param_bytes`` at every
  gather (the bytes of the pieces plus every gathered layer's storage): at rest
  S/N; at the peak S/N plus the layer computing and, with prefetch, the next one.
  Printed beside S/N + one layer and S/N + two layers;
* **resident peak of one step** (the kernel's high-water mark, as
  ``benchmarks.memory`` measures it: freed large blocks go back to the kernel at once),
  above the process's resident set before the model was built: FSDP beside a
  replicated model (every rank the whole model; ``collectives.all_reduce`` of the
  gradients, as DDP). Both include gradients and the optimizer's (SGD, no state).
"""
import argparse
import gc

import torch
import torch.nn as nn

import collectives
from benchmarks import common
from benchmarks.memory import _libc, exact_malloc, reset_peak, status_bytes
from collectives.parallel.fsdp import FullyShardedDataParallel

ROWS = 4


def layers(args):
    torch.manual_seed(0)
    return [nn.Linear(args.width, args.width) for _ in range(args.layers)]


def settle():
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def measure(args, kind, n):
    settle()
    before = status_bytes("VmRSS")
    if kind == "fsdp":
        model = FullyShardedDataParallel(layers(args), prefetch=not args.no_prefetch)
    else:
        model = nn.Sequential(*layers(args))
    settle()
    at_rest = status_bytes("VmRSS") - before
    reset_peak()
    x = torch.randn(ROWS, args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model(x).pow(2).mean().backward()
    if kind == "replicated":
        for p in model.parameters():
            collectives.all_reduce(p.grad)
            p.grad /= n
    opt.step()
    peak = status_bytes("VmHWM") - before
    counted = (model.peak_bytes, model.param_bytes()) if kind == "fsdp" else (None, None)
    del model, opt
    return at_rest, peak, counted


def worker(args, rank, n, device):
    exact_malloc()
    measure(args, "fsdp", n)          # warm: connections, allocator, code
    out = {}
    for kind in ("replicated", "fsdp"):
        at_rest, peak, (peak_params, rest_params) = measure(args, kind, n)
        t = torch.tensor([at_rest, peak, peak_params or 0, rest_params or 0], dtype=torch.float64)
        collectives.all_reduce(t, op=collectives.ReduceOp.MAX)
        out[kind] = t.tolist()
    return out


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
          f"{'S/N+2 layers':>13} {'RSS peak FSDP':>14} {'RSS peak replicated':>20}")
    for n, out in common.run_worlds(worker, args):
        _, fsdp_peak, peak_params, rest_params = out["fsdp"]
        _, repl_peak, _, _ = out["replicated"]
        pieces = -(-(args.width * args.width + args.width) // n) * 4 * args.layers     # S/N, padded
        print(f"{n:3d} {rest_params / mib:15.2f} {pieces / mib:7.2f} {peak_params / mib:12.2f} "
              f"{(pieces + layer) / mib:12.2f} {(pieces + 2 * layer) / mib:13.2f} {fsdp_peak / mib:14.1f} "
              f"{repl_peak / mib:20.1f}")


if __name__ == "__main__":
    main()
