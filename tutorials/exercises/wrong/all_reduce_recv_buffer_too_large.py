"""Receives into buffers larger than the message: gloo accepts it, NCCL and the library do not.

Chunks of tensor_split differ by one element when N does not divide the size;
this solution receives every chunk into a buffer the size of the largest and
adds only its first part. The result is right on gloo, but a receive must name
exactly the message's size: NCCL (and collectives' own door) fail or hang on it.
"""
import torch
import torch.distributed as dist


def exchange(send, right, recv, left):
    for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, right),
                                           dist.P2POp(dist.irecv, recv, left)]):
        request.wait()


def all_reduce(tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)
    inbox = torch.empty_like(chunks[0])           # the largest chunk's size, used for every chunk
    for step in range(n - 1):
        send_i, recv_i = (rank - step - 1) % n, (rank - step - 2) % n
        exchange(chunks[send_i], right, inbox, left)
        chunks[recv_i].add_(inbox[:chunks[recv_i].numel()])
    for step in range(n - 1):
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n
        exchange(chunks[send_i], right, inbox, left)
        chunks[recv_i].copy_(inbox[:chunks[recv_i].numel()])
