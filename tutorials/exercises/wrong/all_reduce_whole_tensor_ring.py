"""Wrong (wasteful): the whole-tensor ring. Correct sums, but each rank sends (N-1) x S bytes, not 2(N-1)/N x S."""
import torch
import torch.distributed as dist


def all_reduce(tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    outgoing, incoming, total = tensor.clone(), torch.empty_like(tensor), tensor.clone()
    for _ in range(n - 1):
        requests = [dist.isend(outgoing, right), dist.irecv(incoming, left)]
        for r in requests:
            r.wait()
        total += incoming
        outgoing, incoming = incoming, outgoing
    tensor.copy_(total)
