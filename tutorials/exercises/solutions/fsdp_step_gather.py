"""Reference solution, step 1 of fsdp_step: all-gather the pieces, cut off the padding, view each tensor."""
import math

import torch
import torch.distributed as dist

from tutorials.exercises.solutions.all_gather import all_gather


def fsdp_step_gather(shard, shapes, group=None):
    k = shard.numel()
    full = torch.empty(k * dist.get_world_size(), dtype=shard.dtype)
    all_gather(list(full.split(k)), shard)
    sizes = [math.prod(shape) for shape in shapes]
    parts = full[:sum(sizes)].split(sizes)          # the padding is the tail: past the last tensor
    return [part.view(shape) for part, shape in zip(parts, shapes)]
