"""Changes its input: the running sums are kept in the caller's input_list, not in a copy.

The output is right, but the caller's input_list no longer holds what it passed in
(torch's reduce_scatter leaves it as it was): the piece a rank forwards is overwritten
by the sums it adds into it.
"""
import torch
import torch.distributed as dist


def reduce_scatter(output, input_list, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    partial = input_list                           # should be [t.clone() for t in input_list]
    inbox = torch.empty_like(output)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        send_i, recv_i = (rank - step - 1) % n, (rank - step - 2) % n
        ops = [dist.P2POp(dist.isend, partial[send_i], right), dist.P2POp(dist.irecv, inbox, left)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        partial[recv_i].add_(inbox)
    output.copy_(partial[rank])
