"""Deadlocks for odd N only: a bidirectional ring ordered by parity (even ranks send first).

Pieces travel both ways round the ring, so half the steps are needed. Each step
a rank sends to both neighbours and receives from both, with blocking calls:
even ranks send first, odd ranks receive first. With N even every sender faces
a receiver. With N odd, ranks N-1 and 0 are both even and neighbours: each
waits to send to the other, and neither receives.
"""
import torch.distributed as dist


def all_gather(tensor_list, tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    tensor_list[rank].copy_(tensor)
    right, left = (rank + 1) % n, (rank - 1) % n
    steps = n // 2                                 # pieces come from at most n // 2 ranks away
    for s in range(steps):
        both_ways = not (n % 2 == 0 and s == steps - 1)   # the farthest piece, N even: one way only
        sends = [(tensor_list[(rank - s) % n], right)]
        recvs = [(tensor_list[(rank - s - 1) % n], left)]
        if both_ways:
            sends.append((tensor_list[(rank + s) % n], left))
            recvs.append((tensor_list[(rank + s + 1) % n], right))
        if rank % 2 == 0:
            for t, peer in sends:
                dist.send(t, peer)
            for t, peer in recvs:
                dist.recv(t, peer)
        else:
            for t, peer in recvs:
                dist.recv(t, peer)
            for t, peer in sends:
                dist.send(t, peer)
