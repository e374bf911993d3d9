"""Wrong: asks gloo's process group object for the all_reduce, a route the grader cannot switch off
by name; its messages are not counted, so 0 bytes on N > 1 ranks is below any all_reduce's bound."""
import torch.distributed as dist


def all_reduce(tensor, group=None):
    pg = group if group is not None else dist.group.WORLD
    pg.allreduce([tensor]).wait()
