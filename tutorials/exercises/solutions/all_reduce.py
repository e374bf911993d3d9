"""Reference solution: ring all_reduce (reduce-scatter, then all-gather), chapter 4."""
import torch
import torch.distributed as dist


def exchange(send, right, recv, left):
    """Post a send and its matching receive together, so no rank waits on a rank that is sending."""
    for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, right),
                                           dist.P2POp(dist.irecv, recv, left)]):
        request.wait()


def all_reduce(tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)      # exactly n views, sizes differ by at most one
    inbox = torch.empty_like(chunks[0])
    for step in range(n - 1):                     # reduce-scatter: partial sums travel right
        send_i, recv_i = (rank - step - 1) % n, (rank - step - 2) % n
        got = inbox[:chunks[recv_i].numel()]
        exchange(chunks[send_i], right, got, left)
        chunks[recv_i].add_(got)
    for step in range(n - 1):                     # all-gather: finished chunks travel right
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n
        exchange(chunks[send_i], right, chunks[recv_i], left)
