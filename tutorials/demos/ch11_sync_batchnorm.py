"""Chapter 11: SyncBatchNorm, BatchNorm statistics over the global batch.

    python -m tutorials.demos.ch11_sync_batchnorm

1. A global batch of 8 images, 2 per rank: what each rank's BatchNorm
   normalizes with, locally and synchronized.
2. The outputs and gradients against one process normalizing all 8 at once.
3. What synchronizing costs: the messages of one forward and backward.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from collectives.parallel.sync_batchnorm import SyncBatchNorm
from tutorials.demos.common import run

WORLD_SIZE = 4
PER_RANK = 2
CHANNELS = 16


def global_batch():
    g = torch.Generator().manual_seed(0)   # every rank builds the same global batch, then takes its slice
    images = torch.randn(WORLD_SIZE * PER_RANK, CHANNELS, 8, 8, generator=g, dtype=torch.float64)
    return images * 2 + torch.arange(WORLD_SIZE * PER_RANK, dtype=torch.float64).view(-1, 1, 1, 1)


def demo(rank, world_size):
    images = global_batch()
    mine = images[rank * PER_RANK:(rank + 1) * PER_RANK]
    local_mean = mine[:, 0].mean().item()
    means = [None] * world_size
    dist.all_gather_object(means, round(local_mean, 2))
    if rank == 0:
        print(f"1. channel 0's mean: {PER_RANK} images per rank see {means}, "
              f"the global batch of {len(images)} sees {images[:, 0].mean().item():.2f}")

    one_process = nn.BatchNorm2d(CHANNELS).double()
    everything = images.clone().requires_grad_()
    one_process(everything).pow(2).sum().backward()       # the loss of all 8 images

    local = nn.BatchNorm2d(CHANNELS).double()
    synced = SyncBatchNorm(CHANNELS).double()
    x = mine.clone().requires_grad_()
    with collectives.count_traffic() as traffic:
        y = synced(x)
        y.pow(2).sum().backward()                         # this rank's share of the same loss
    expected = one_process(images)[rank * PER_RANK:(rank + 1) * PER_RANK]
    expected_grad = everything.grad[rank * PER_RANK:(rank + 1) * PER_RANK]
    found = torch.tensor([(local(mine) - expected).abs().max().item(),
                          (y - expected).abs().max().item(),
                          (x.grad - expected_grad).abs().max().item()], dtype=torch.float64)
    collectives.all_reduce(found, op=dist.ReduceOp.MAX)
    sent = [None] * world_size
    dist.all_gather_object(sent, (traffic.sent_bytes, traffic.sent_messages))
    if rank == 0:
        print("2. largest difference from one process normalizing all 8 images, over the 4 ranks")
        print(f"   nn.BatchNorm2d, local statistics:  outputs {found[0].item():.2f}")
        print(f"   SyncBatchNorm, global statistics:  outputs below 1e-12: {found[1].item() < 1e-12}, "
              f"input gradients below 1e-12: {found[2].item() < 1e-12}")
        print(f"3. one forward and backward: ranks 0-3 sent {[s[0] for s in sent]} bytes "
              f"in {[s[1] for s in sent]} messages")
        print(f"   (an all_gather of 2C+1 = {2 * CHANNELS + 1} float64 per rank, "
              f"an all_reduce of 2C = {2 * CHANNELS} float64)")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
