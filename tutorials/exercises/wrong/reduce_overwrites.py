"""Wrong result: receives straight into the tensor, so each partial sum overwrites instead of adding."""
import torch.distributed as dist


def reduce(tensor, dst, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - dst) % n
    mask = 1
    while mask < n:
        if v & mask:
            dist.send(tensor, (v - mask + dst) % n)
            return
        if v + mask < n:
            dist.recv(tensor, (v + mask + dst) % n)      # should receive into a buffer and add
        mask *= 2
