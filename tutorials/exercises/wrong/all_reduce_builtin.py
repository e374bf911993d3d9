"""Wrong: calls the built-in collective instead of building it (the grader switches built-ins off)."""
import torch.distributed as dist


def all_reduce(tensor, group=None):
    dist.all_reduce(tensor, group=group)
