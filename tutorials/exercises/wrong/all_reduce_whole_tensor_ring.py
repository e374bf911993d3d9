"""Wrong (wasteful): the whole-tensor ring. Correct sums, but each rank sends (N-1) x S bytes, not 2(N-1)/N x S.

Every tensor travels all the way round; each rank keeps them by rank and adds them
up in rank order, so every rank ends with the same bits (adding them in arrival
order would not: see wrong/all_reduce_own_order.py).
"""
import torch
import torch.distributed as dist


def all_reduce(tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    held = {rank: tensor.clone()}
    outgoing = held[rank]
    for step in range(n - 1):
        incoming = torch.empty_like(tensor)
        requests = [dist.isend(outgoing, right), dist.irecv(incoming, left)]
        for r in requests:
            r.wait()
        held[(rank - step - 1) % n] = incoming
        outgoing = incoming
    total = held[0].clone()
    for r in range(1, n):
        total += held[r]
    tensor.copy_(total)
