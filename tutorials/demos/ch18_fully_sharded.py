"""Chapter 18: fully sharded data parallel (ZeRO-3, FSDP), on four processes.

    python -m tutorials.demos.ch18_fully_sharded

1. Three SGD-with-momentum steps of a 3-layer MLP sharded over 4 ranks, each rank on its own
   batch, against one process training on the four batches together.
2. Bytes each rank sends in one step, counted, against 3(N-1)/N x S (and DDP's 2(N-1)/N x S).
3. Parameter bytes each rank holds: at rest (its pieces) and at the peak of a step,
   against S/N and S/N + one or two layers.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from collectives.parallel.fsdp import FullyShardedDataParallel
from tutorials.demos.common import run

WORLD_SIZE = 4
STEPS = 3


def layers():
    torch.manual_seed(0)      # the same initial weights in every process
    return [nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10)]


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)    # each rank its own slice of the batch
    return torch.randn(8, 32, generator=g, dtype=torch.float64), torch.randint(0, 10, (8,), generator=g)


def one_process(n):
    model = nn.Sequential(*layers()).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        xs, ys = zip(*[batch(r, step) for r in range(n)])
        nn.functional.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return model


def demo(rank, n):
    model = FullyShardedDataParallel([m.double() for m in layers()])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)     # this rank's pieces only
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(rank, step)
        with collectives.count_traffic() as traffic:
            nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    # the whole model again, to compare: every layer's pieces gathered
    whole = []
    for i, piece in enumerate(model.shards):
        flat = torch.empty(piece.numel() * n, dtype=piece.dtype)
        collectives.all_gather(list(flat.split(piece.numel())), piece.detach())
        whole += list(model.params_of(i, flat).values())
    reference = one_process(n)
    diff = max((a - b).abs().max().item() for a, b in zip(whole, reference.parameters()))
    row = (diff, traffic.sent_bytes, traffic.sent_messages, model.param_bytes(), model.peak_bytes)
    everyone = [None] * n
    dist.all_gather_object(everyone, row)     # for printing only
    if rank == 0:
        sizes = [k * n * 8 for k in model.piece]           # each layer's padded flat vector, float64
        s = sum(sizes)
        params = sum(p.numel() for p in reference.parameters())
        print(f"1. {STEPS} SGD steps, {params} float64 parameters in {len(sizes)} layers, {n} ranks, "
              f"each its own batch")
        print(f"   largest difference from one process on all batches: below 1e-12: "
              f"{all(r[0] < 1e-12 for r in everyone)}")
        print(f"2. bytes each rank sends per step, S = {s} bytes (padded to {n} pieces per layer)")
        print(f"   FSDP (2 all-gathers + 1 reduce-scatter per layer): {[r[1] for r in everyone]} "
              f"in {everyone[0][2]} messages")
        print(f"   3(N-1)/N x S = {3 * (n - 1) * s // n}; DDP's ring all_reduce: 2(N-1)/N x S = "
              f"{2 * (n - 1) * s // n}")
        print(f"3. parameter bytes held per rank (layers of {', '.join(map(str, sizes))} bytes)")
        print(f"   at rest: {[r[3] for r in everyone]}   S/N = {s // n}")
        print(f"   peak:    {[r[4] for r in everyone]}   S/N + largest layer = {s // n + max(sizes)}, "
              f"+ two largest = {s // n + sum(sorted(sizes)[-2:])}")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
