"""What makes two MNIST trainings give the same digits, and what does not.

    python -m benchmarks.determinism --data-dir ../shared/data

Runs the same short training (the MNIST net, 4 gloo ranks, ``DataParallel``,
global batch 128, SGD with momentum, 30 steps, seed 0) several times, each in
fresh processes, changing one thing at a time, and prints per run the last
loss and a checksum of the parameters written in full, with whether its bits
equal the first run's:

* the same run again (is a run deterministic on this machine?);
* ``--algorithm ring`` and ``tree`` instead of ``algorithm=None``'s choice
  (another order of summation in the gradient all_reduce);
* 2 intra-op threads per rank instead of 1 (what ``--threads``, or a machine
  with more cores per rank, changes);
* CPU kernels limited to AVX2 (``ATEN_CPU_CAPABILITY=avx2``,
  ``ONEDNN_MAX_CPU_ISA=AVX2``): what a CPU without AVX-512 would run.

Each variant that is not bitwise equal to the first will, over a full
training, end at other accuracies in the second decimal.
"""
import argparse
import ast
import os
import subprocess
import sys

import torch
import torch.nn as nn

import collectives
from collectives.train.models import Net

STEPS = 30


def worker(rank, world_size, data_dir, algorithm, threads):
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)   # as collectives.train does
    from collectives.train.data import load_mnist, prepare_mnist, train_loader
    if rank == 0:
        prepare_mnist(data_dir)
    collectives.barrier()
    dataset = load_mnist(prepare_mnist(data_dir, download=False), subset=4096)
    loader = train_loader(dataset, 128, rank, world_size)
    torch.manual_seed(0)
    model = collectives.DataParallel(Net(), algorithm=algorithm)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step + 1 == STEPS:
            break
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
    return (float(loss), float(flat.sum()), float(flat.abs().sum())) if rank == 0 else None


AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
VARIANTS = [
    ("algorithm=None (this machine's choice)", [], {}),
    ("the same again", [], {}),
    ("--algorithm ring", ["--algorithm", "ring"], {}),
    ("--algorithm tree", ["--algorithm", "tree"], {}),
    ("2 threads per rank", ["--threads", "2"], {}),
    ("CPU kernels limited to AVX2", [], AVX2),
    ("AVX2, --algorithm tree", ["--algorithm", "tree"], AVX2),
    ("AVX2, --algorithm ring", ["--algorithm", "ring"], AVX2),
]


def one(args):
    from tutorials.demos.common import run
    result = run(worker, 4, args.data_dir, args.algorithm, args.threads)[0]
    print(repr(result))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=os.environ.get("COLLECTIVES_DATA", "data"))
    p.add_argument("--algorithm", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--one", action="store_true", help="run one variant here (used by the driver)")
    args = p.parse_args(argv)
    if args.one:
        return one(args)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{STEPS} steps, 4 ranks")
    first = None
    for name, flags, env in VARIANTS:
        out = subprocess.run([sys.executable, "-m", "benchmarks.determinism", "--one", "--data-dir",
                              args.data_dir, *flags], capture_output=True, text=True,
                             env={**os.environ, **env}, check=True).stdout.strip().splitlines()[-1]
        first = first or out
        loss, total, size = ast.literal_eval(out)
        print(f"  {name:40s} loss {loss!r:22s} sum of parameters {total!r:22s} "
              f"same bits as the first: {out == first}")


if __name__ == "__main__":
    main()
