"""Wrong (not sharded): keeps the momentum in a module global, outside the ``state`` dict it was
handed (which holds only a step count). Right parameters, right traffic; but every rank holds
the momentum of all P parameters, not P/N."""
import torch
import torch.distributed as dist

from tutorials.exercises.solutions.all_reduce import all_reduce

MOMENTUM = []


def zero1_step(params, state, lr, momentum=0.9, group=None):
    if "step" not in state:                 # a new optimizer: new buffers
        MOMENTUM.clear()
        state["step"] = 0
    for i, p in enumerate(params):
        grad = p.grad.clone()
        all_reduce(grad)
        grad /= dist.get_world_size()
        if state["step"] == 0:
            MOMENTUM.append(grad)
        else:
            MOMENTUM[i].mul_(momentum).add_(grad)
        with torch.no_grad():
            p.sub_(lr * MOMENTUM[i])
    state["step"] += 1
