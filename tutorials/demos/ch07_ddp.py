"""Chapter 7: from average_gradients to DataParallel (what DistributedDataParallel does).

    python -m tutorials.demos.ch07_ddp

1. Buckets: how many collectives one backward pass issues.
2. The same training as torch's DistributedDataParallel.
3. no_sync: accumulate gradients over micro-batches without communicating.
4. Buffers: BatchNorm statistics copied from rank 0 before every forward.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import collectives
from collectives.train.models import Net
from tutorials.demos.common import print_ranks, run

WORLD_SIZE = 4


def batch(rank, step, n=8):
    """A batch of fake MNIST-shaped images, different on every rank and step."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def max_difference(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def demo(rank, world_size):
    # 1. The MNIST net has 8 parameter tensors. The naive way: one all_reduce each.
    torch.manual_seed(0)
    net = Net()
    sizes = [p.numel() for p in net.parameters()]
    naive = Net()
    naive.load_state_dict(net.state_dict())
    with collectives.count_traffic() as traffic:
        x, y = batch(rank, 0)
        nn.functional.cross_entropy(naive(x), y).backward()
        collectives.average_gradients(naive, algorithm="ring")
    naive_messages = traffic.sent_messages
    bucketed = collectives.DataParallel(Net(), bucket_cap_mb=0.05, algorithm="ring")
    bucketed.module.load_state_dict(net.state_dict())
    with collectives.count_traffic() as traffic:
        nn.functional.cross_entropy(bucketed(x), y).backward()
    if rank == 0:
        print(f"1. parameter tensors (backward order): {sizes[::-1]}")
        buckets = [[p.numel() for p in b.params] for b in bucketed.buckets]
        print(f"   average_gradients: {len(sizes)} all_reduce calls after backward, "
              f"{naive_messages} messages per rank")
        print(f"   DataParallel(bucket_cap_mb=0.05): {len(buckets)} buckets {buckets}, "
              f"{traffic.sent_messages} messages per rank, started during backward")

    # 2. Four steps of SGD with ours and with torch's DDP, from the same weights.
    def train(model, steps=4):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for step in range(steps):
            x, y = batch(rank, step)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        return model

    torch.manual_seed(rank)              # different weights per rank: the wrappers broadcast rank 0's
    ours = train(collectives.DataParallel(Net()))
    torch.manual_seed(rank)
    theirs = train(DistributedDataParallel(Net()))
    diff = max_difference(ours.module, theirs.module)
    diffs = [None] * world_size
    dist.all_gather_object(diffs, diff)
    if rank == 0:
        print(f"2. 4 steps, collectives.DataParallel vs torch DistributedDataParallel: "
              f"same weights on every rank (to 1e-6): {max(diffs) < 1e-6}")

    # 3. Two micro-batches per step: the first under no_sync() sends nothing.
    model = collectives.DataParallel(Net(), algorithm="ring")
    reference = Net()
    reference.load_state_dict(model.module.state_dict())
    with collectives.count_traffic() as quiet:
        with model.no_sync():
            x, y = batch(rank, 10)
            nn.functional.cross_entropy(model(x), y).backward()
    with collectives.count_traffic() as loud:
        x2, y2 = batch(rank, 11)
        nn.functional.cross_entropy(model(x2), y2).backward()
    # The same gradient the slow way: accumulate both locally, then average once.
    nn.functional.cross_entropy(reference(x), y).backward()
    nn.functional.cross_entropy(reference(x2), y2).backward()
    collectives.average_gradients(reference)
    gap = max((p.grad - q.grad).abs().max().item()
              for p, q in zip(model.module.parameters(), reference.parameters()))
    if rank == 0:
        print(f"3. backward inside no_sync(): {quiet.sent_bytes} bytes sent; next backward: "
              f"{loud.sent_bytes} bytes; gradients equal accumulate-then-average: {gap < 1e-6}")

    # 4. BatchNorm keeps running statistics, updated by each rank from its own data.
    model = collectives.DataParallel(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    seen = []
    model.module[1].register_forward_pre_hook(lambda m, _: seen.append(m.running_mean.clone()))
    for step in range(2):
        model(torch.randn(4, 2, generator=torch.Generator().manual_seed(10 * rank + step)) + rank)
    if rank == 0:
        print("4. BatchNorm running_mean at the start of forward 2 (rank 0's, copied) and after it "
              "(each rank's own update):")
    after = model.module[1].running_mean
    print_ranks(f"start {[round(v, 4) for v in seen[1].tolist()]}, "
                f"after {[round(v, 4) for v in after.tolist()]}")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
