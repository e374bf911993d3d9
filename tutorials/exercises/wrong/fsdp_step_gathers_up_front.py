"""Wrong (not sharded in time): gathers every layer before the first forward, then drops each
after its use. The gradients are right and each layer is handed to ``layers[i]`` alone, but at
the first layer's forward every layer's full vector is alive: the whole model, unsharded."""
import torch
import torch.distributed as dist

from tutorials.exercises.solutions.all_gather import all_gather
from tutorials.exercises.solutions.reduce_scatter import reduce_scatter


def gather(piece):
    full = torch.empty(piece.numel() * dist.get_world_size(), dtype=piece.dtype)
    all_gather(list(full.split(piece.numel())), piece)
    return full


def fsdp_step(shards, layers, x, target, loss_fn, group=None):
    n = dist.get_world_size()
    fulls = [gather(shard) for shard in shards]      # the whole model at once
    inputs = []
    with torch.no_grad():
        for i, layer in enumerate(layers):
            inputs.append(x)
            x = layer(fulls[i], x)
            fulls[i] = None                          # dropped after use: too late, all were alive
    grads = [None] * len(shards)
    grad_out = None
    for i in reversed(range(len(shards))):
        full = gather(shards[i]).requires_grad_()
        x_in = inputs[i].detach().requires_grad_(i > 0)
        y = layers[i](full, x_in)
        out = loss_fn(y, target) if grad_out is None else y
        got = torch.autograd.grad(out, [full, x_in] if i > 0 else [full], grad_out)
        piece = torch.empty_like(shards[i])
        reduce_scatter(piece, list(got[0].split(shards[i].numel())))
        grads[i] = piece / n
        grad_out = got[1] if i > 0 else None
    return grads
