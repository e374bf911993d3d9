"""Wrong (wasteful): every rank sends its whole input_list to every other rank and sums locally: (N-1) x N x S bytes."""
import torch
import torch.distributed as dist


def reduce_scatter(output, input_list, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    output.copy_(input_list[rank])
    inbox = [torch.empty_like(t) for t in input_list]
    for step in range(1, n):
        to, frm = (rank + step) % n, (rank - step) % n
        requests = [dist.isend(t, to) for t in input_list] + [dist.irecv(t, frm) for t in inbox]
        for r in requests:
            r.wait()
        output.add_(inbox[rank])
