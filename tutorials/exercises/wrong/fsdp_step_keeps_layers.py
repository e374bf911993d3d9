"""Wrong (not sharded in time): gathers each layer once and keeps the autograd graph through
all of them: right gradients and less traffic, but every layer's full vector is alive at once."""
import torch
import torch.distributed as dist

from tutorials.exercises.solutions.all_gather import all_gather
from tutorials.exercises.solutions.reduce_scatter import reduce_scatter


def fsdp_step(shards, layers, x, target, loss_fn, group=None):
    n = dist.get_world_size()
    fulls = []
    for shard, layer in zip(shards, layers):
        full = torch.empty(shard.numel() * n, dtype=shard.dtype)
        all_gather(list(full.split(shard.numel())), shard)
        fulls.append(full.requires_grad_())
        x = layer(fulls[-1], x)
    flat_grads = torch.autograd.grad(loss_fn(x, target), fulls)
    grads = []
    for shard, g in zip(shards, flat_grads):
        piece = torch.empty_like(shard)
        reduce_scatter(piece, list(g.split(shard.numel())))
        grads.append(piece / n)
    return grads
