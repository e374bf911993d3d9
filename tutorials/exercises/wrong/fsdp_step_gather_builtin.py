"""Wrong: gathers with the built-in dist.all_gather, switched off while grading (build it from messages)."""
import math

import torch
import torch.distributed as dist


def fsdp_step_gather(shard, shapes, group=None):
    k = shard.numel()
    pieces = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, shard)
    sizes = [math.prod(shape) for shape in shapes]
    parts = torch.cat(pieces)[:sum(sizes)].split(sizes)
    return [part.view(shape) for part, shape in zip(parts, shapes)]
