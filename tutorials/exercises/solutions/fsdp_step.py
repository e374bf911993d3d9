"""Reference solution: gather each layer for its forward and again for its backward (recomputing
its output from the kept input), reduce-scatter its gradient (chapter 18)."""
import torch
import torch.distributed as dist

from tutorials.exercises.solutions.all_gather import all_gather
from tutorials.exercises.solutions.reduce_scatter import reduce_scatter


def gather(piece):
    """The layer's full flat vector: every rank's piece, in rank order."""
    full = torch.empty(piece.numel() * dist.get_world_size(), dtype=piece.dtype)
    all_gather(list(full.split(piece.numel())), piece)
    return full


def fsdp_step(shards, layers, x, target, loss_fn, group=None):
    n = dist.get_world_size()
    inputs = []
    with torch.no_grad():                       # forward: only the activations stay
        for shard, layer in zip(shards, layers):
            inputs.append(x)
            x = layer(gather(shard), x)         # the full vector is freed as soon as it is used
    grads = [None] * len(shards)
    grad_out = None
    for i in reversed(range(len(shards))):      # backward: gather again, recompute, differentiate
        full = gather(shards[i]).requires_grad_()
        x_in = inputs[i].detach().requires_grad_(i > 0)
        y = layers[i](full, x_in)
        out = loss_fn(y, target) if grad_out is None else y     # the last layer starts from the loss
        got = torch.autograd.grad(out, [full, x_in] if i > 0 else [full], grad_out)
        piece = torch.empty_like(shards[i])
        reduce_scatter(piece, list(got[0].split(shards[i].numel())))
        grads[i] = piece / n
        grad_out = got[1] if i > 0 else None
    return grads
