"""Wrong (not sharded): all_reduce the gradients and update every parameter on every rank: right
parameters, right traffic, but each rank keeps the momentum of all P parameters instead of P/N."""
import torch
import torch.distributed as dist

from tutorials.exercises.solutions.all_reduce import all_reduce


def zero1_step(params, state, lr, momentum=0.9, group=None):
    grad = torch.cat([p.grad.flatten() for p in params])
    all_reduce(grad)
    grad /= dist.get_world_size()
    if "momentum" not in state:
        state["momentum"] = grad.clone()
    else:
        state["momentum"].mul_(momentum).add_(grad)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.sub_(lr * state["momentum"][offset:offset + p.numel()].view_as(p))
            offset += p.numel()
