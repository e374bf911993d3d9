"""Reference solution: binomial-tree reduce, chapter 5."""
import torch
import torch.distributed as dist


def reduce(tensor, dst, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - dst) % n                  # rank relative to the root: the root is 0
    inbox = torch.empty_like(tensor)
    mask = 1
    while mask < n:
        if v & mask:                      # lowest set bit: hand the partial sum down and stop
            dist.send(tensor, (v - mask + dst) % n)
            return
        if v + mask < n:                  # collect the subtree that hangs below v + mask
            dist.recv(inbox, (v + mask + dst) % n)
            tensor.add_(inbox)
        mask *= 2
