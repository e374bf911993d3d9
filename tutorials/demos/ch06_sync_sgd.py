"""Chapter 6: synchronous SGD from all_reduce, with numbers small enough to check.

    python -m tutorials.demos.ch06_sync_sgd

1. Splitting the data: the tutorial's fixed partition, DistributedSampler and set_epoch.
2. Averaged gradients: every rank's gradient, their mean, and the full-batch gradient.
3. Different starting weights: averaging alone keeps them apart; one broadcast fixes it.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DistributedSampler

import collectives
from collectives.train.data import DataPartitioner
from tutorials.demos.common import print_ranks, run

WORLD_SIZE = 4


def average_gradients(model):
    """The PyTorch tutorial's function, on our all_reduce: sum every gradient, divide by N."""
    size = float(dist.get_world_size())
    for param in model.parameters():
        collectives.all_reduce(param.grad)
        param.grad /= size


def numbers(t):
    return "[" + ", ".join(f"{v:.4f}" for v in t.flatten().tolist()) + "]"


def global_batch():
    """8 examples of y = x0 - x1 + 0.5; each of the 4 ranks gets 2."""
    x = torch.arange(16.0).view(8, 2) / 10
    return x, x @ torch.tensor([1.0, -1.0]) + 0.5


def loss_of(model, x, y):
    return ((model(x).squeeze(1) - y) ** 2).mean()


def demo(rank, world_size):
    # 1. Who reads what. Every rank builds the same split from the same seed.
    indices = list(range(16))
    mine = DataPartitioner(indices, [1 / world_size] * world_size, seed=1234).use(rank)
    if rank == 0:
        print("1. DataPartitioner (the tutorial's): one shuffle, fixed for good")
    print_ranks(sorted(mine[i] for i in range(len(mine))))
    sampler = DistributedSampler(indices, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    seen = []
    for epoch in range(2):
        sampler.set_epoch(epoch)          # forget this and every epoch repeats epoch 0's order
        seen.append(list(sampler))
    if rank == 0:
        print("   DistributedSampler with set_epoch(0), set_epoch(1): a new split every epoch")
    print_ranks(f"epoch 0 {seen[0]}, epoch 1 {seen[1]}")

    # 2. Same weights on every rank, a different quarter of the batch on each.
    x, y = global_batch()
    xs, ys = x[2 * rank:2 * rank + 2], y[2 * rank:2 * rank + 2]
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, 0.5]]))
        model.bias.fill_(0.0)
    loss_of(model, xs, ys).backward()
    local = model.weight.grad.clone()
    everyone = [None] * world_size
    dist.all_gather_object(everyone, local)
    average_gradients(model)
    if rank == 0:
        print("2. weight gradient on each rank's 2 examples, before averaging:")
    print_ranks(numbers(local))
    if rank == 0:
        full = nn.Linear(2, 1)
        full.load_state_dict({"weight": torch.tensor([[0.5, 0.5]]), "bias": torch.zeros(1)})
        loss_of(full, x, y).backward()
        print(f"   mean of the four, by hand:             {numbers(sum(everyone) / world_size)}")
        print(f"   after average_gradients, on rank 0:    {numbers(model.weight.grad)}")
        print(f"   one process, all 8 examples at once:   {numbers(full.weight.grad)}")
    library = nn.Linear(2, 1)
    library.load_state_dict({"weight": torch.tensor([[0.5, 0.5]]), "bias": torch.zeros(1)})
    loss_of(library, xs, ys).backward()
    collectives.average_gradients(library)
    same = torch.equal(library.weight.grad, model.weight.grad)
    if rank == 0:
        print(f"   collectives.average_gradients gives the same bits: {same}")

    # 3. Different starting weights (a different seed per rank).
    torch.manual_seed(rank)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def distance_to_rank0():
        w = torch.cat([p.detach().flatten() for p in model.parameters()])
        w0 = w.clone()
        collectives.broadcast(w0, src=0)
        return (w - w0).abs().max().item()

    def train(steps):
        for _ in range(steps):
            optimizer.zero_grad()
            loss_of(model, xs, ys).backward()
            average_gradients(model)
            optimizer.step()

    if rank == 0:
        print("3. ranks seeded differently: largest |w - w_rank0| after 0, 5, 10 steps of averaged SGD")
    trace = [distance_to_rank0()]
    for _ in range(2):
        train(5)
        trace.append(distance_to_rank0())
    print_ranks(" ".join(f"{d:.4f}" for d in trace))
    with torch.no_grad():
        for p in model.parameters():
            collectives.broadcast(p, src=0)
    trace = [distance_to_rank0()]
    train(5)
    trace.append(distance_to_rank0())
    if rank == 0:
        print("   after broadcasting rank 0's weights, then 5 more steps:")
    print_ranks(" ".join(f"{d:.4f}" for d in trace))


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
