"""Wrong: exchanges the counts with the built-in dist.all_to_all_single, switched off while grading."""
import torch
import torch.distributed as dist


def moe_dispatch_counts(expert_of, group=None):
    send = torch.bincount(expert_of, minlength=dist.get_world_size())
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return send, recv
