"""Reference solution: all gradients in one flat tensor, one ring all_reduce, divide by N (chapter 6)."""
import torch
import torch.distributed as dist

from tutorials.exercises.solutions.all_reduce import all_reduce


def average_gradients(model, group=None):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])      # one message per ring step, not one per tensor
    all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
