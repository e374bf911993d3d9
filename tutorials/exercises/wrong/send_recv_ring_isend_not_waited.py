"""Wrong (drops the send's handle): posts its send with dist.isend but never waits on the request
it returns. The message may leave or not: the handle is the only way to know, and a buffer reused
or freed before its send has finished sends whatever it holds then."""
import torch
import torch.distributed as dist


def send_recv_ring(tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return
    dist.isend(tensor.clone(), (rank + 1) % n)     # the request is dropped: never waited on
    dist.recv(tensor, (rank - 1) % n)
