"""Wrong (not sharded): keeps each parameter's momentum on the parameter itself
(``p.momentum_buffer``), outside the ``state`` dict it was handed. Right parameters, right
traffic, an empty ``state``; but every rank holds the momentum of all P parameters, not P/N."""
import torch
import torch.distributed as dist

from tutorials.exercises.solutions.all_reduce import all_reduce


def zero1_step(params, state, lr, momentum=0.9, group=None):
    for p in params:
        grad = p.grad.clone()
        all_reduce(grad)
        grad /= dist.get_world_size()
        if not hasattr(p, "momentum_buffer"):
            p.momentum_buffer = grad
        else:
            p.momentum_buffer.mul_(momentum).add_(grad)
        with torch.no_grad():
            p.sub_(lr * p.momentum_buffer)
