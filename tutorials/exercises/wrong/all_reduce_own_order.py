"""Ranks disagree in the last bits: every rank gathers all tensors and sums them in its own order.

Each rank starts the sum with its own tensor, so rank r computes
x_r + x_(r+1) + ... while rank r+1 computes x_(r+1) + x_(r+2) + ...: in
floating point (a + b) + c is not a + (b + c), and where values cancel the
ranks end with different results. The ring's all-gather phase avoids this:
each chunk is summed once, on one rank, and that sum is sent to the others.
"""
import torch
import torch.distributed as dist


def all_reduce(tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    gathered = [tensor.clone()]                    # gathered[k]: the tensor of rank (rank - k) % n
    for step in range(n - 1):
        got = torch.empty_like(tensor)
        for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, gathered[-1], right),
                                               dist.P2POp(dist.irecv, got, left)]):
            request.wait()
        gathered.append(got)
    total = gathered[0].clone()
    for t in gathered[1:]:                         # own tensor first, then the left neighbour's, ...
        total += t
    tensor.copy_(total)
