"""Reference solution: binomial-tree broadcast, chapter 5."""
import torch.distributed as dist


def broadcast(tensor, src, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - src) % n                  # rank relative to the root: the root is 0
    step = 1
    while step < n:
        if v < step and v + step < n:     # I have the data: pass it on
            dist.send(tensor, (v + step + src) % n)
        elif step <= v < 2 * step:        # my round: receive from the rank that has it
            dist.recv(tensor, (v - step + src) % n)
        step *= 2
