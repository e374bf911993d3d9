"""Chapter 10: ZeRO-1 and ZeRO-2, the optimizer state split over the ranks.

    python -m tutorials.demos.ch10_zero

1. Four Adam steps on an MLP, three ways: data parallel (all_reduce the
   gradients, then torch's Adam on every rank), ZeRO-1 and ZeRO-2.
2. Bytes each rank holds after a step, for groups of N = 1, 2 and 4 ranks.
3. Bytes each rank sends per step: ZeRO against the ring all_reduce.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from collectives.parallel.zero import ZeroOptimizer, optimizer_state_bytes
from tutorials.demos.common import run

WORLD_SIZE = 4
STEPS = 4


def make_model():
    torch.manual_seed(0)      # the same weights on every rank
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 16))   # 3152 parameters


def loss_on_my_batch(model, rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)    # each rank its own slice of the batch
    x, y = torch.randn(16, 32, generator=g), torch.randint(0, 16, (16,), generator=g)
    return nn.functional.cross_entropy(model(x), y)


def train_data_parallel(rank, group):
    model = make_model()
    adam = torch.optim.Adam(model.parameters(), lr=1e-2)
    n = dist.get_world_size(group)
    for step in range(STEPS):
        adam.zero_grad()
        loss_on_my_batch(model, rank, step).backward()
        for p in model.parameters():
            collectives.all_reduce(p.grad, group=group)
            p.grad /= n
        adam.step()
    return model, adam


def train_zero(rank, group, stage):
    model = make_model()
    zero = ZeroOptimizer(model.parameters(), torch.optim.Adam, group=group, stage=stage, lr=1e-2)
    for step in range(STEPS):
        zero.zero_grad()
        loss_on_my_batch(model, rank, step).backward()
        zero.step()
    return model, zero


def largest_difference(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def demo(rank, world_size):
    groups = {n: dist.new_group(list(range(n))) for n in (1, 2, 4)}   # every rank creates every group
    params = sum(p.numel() for p in make_model().parameters())

    reference, adam = train_data_parallel(rank, None)
    zero1, _ = train_zero(rank, None, stage=1)
    zero2, _ = train_zero(rank, None, stage=2)
    if rank == 0:
        print(f"1. {STEPS} Adam steps on a {params}-parameter MLP, {world_size} ranks, each its own batch")
        for name, model in [("ZeRO-1", zero1), ("ZeRO-2", zero2)]:
            diff = largest_difference(model, reference)
            print(f"   {name}: largest difference from data parallel below 1e-6: {diff < 1e-6}")

    rows = {}
    for n, group in groups.items():
        if rank < n:
            _, z1 = train_zero(rank, group, stage=1)
            _, z2 = train_zero(rank, group, stage=2)
            rows[n] = (z1.state_bytes(), z1.grad_bytes(), z2.grad_bytes())
    if rank == 0:
        print(f"2. bytes held by rank 0 after a step (float32; torch's Adam without ZeRO keeps "
              f"{optimizer_state_bytes(adam)} bytes of state on every rank)")
        print("   N   optimizer state   gradients, ZeRO-1   gradients, ZeRO-2")
        for n, (state, grads1, grads2) in rows.items():
            print(f"   {n}   {state:15d}   {grads1:17d}   {grads2:17d}")

    model = make_model()
    zero = ZeroOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    loss_on_my_batch(model, rank, 0).backward()
    with collectives.count_traffic() as zero_traffic:
        zero.step()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    with collectives.count_traffic() as ring_traffic:
        collectives.all_reduce(grads, algorithm="ring")
    sent = [None] * world_size
    dist.all_gather_object(sent, (zero_traffic.sent_bytes, zero_traffic.sent_messages,
                                  ring_traffic.sent_bytes, ring_traffic.sent_messages))
    if rank == 0:
        size = params * 4
        print(f"3. bytes each rank sends per step, N = {world_size}, S = {size} bytes of gradients")
        print(f"   ZeRO (reduce-scatter + all-gather): {[s[0] for s in sent]} in {sent[0][1]} messages")
        print(f"   ring all_reduce of the gradients:   {[s[2] for s in sent]} in {sent[0][3]} messages")
        print(f"   2(N-1)/N x S = {2 * (world_size - 1) * size // world_size}")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
