"""Wrong result: the sum is bound to a new local name (tensor = ...), so the caller's tensor never changes."""
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
        total = total + incoming
        outgoing, incoming = incoming, outgoing
    tensor = total          # rebinds the name; should be tensor.copy_(total)
