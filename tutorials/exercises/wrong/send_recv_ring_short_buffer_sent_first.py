"""Wrong (receive buffer too short, found after its sender has moved on): even ranks send first,
odd ranks receive first (a ring that cannot deadlock), but every receive names a buffer one
element shorter than the message. When gloo aborts the receiver, its sender is already done with
that send and waiting on its own receive: what it sent, not where it is, shows the mismatch."""
import torch
import torch.distributed as dist


def send_recv_ring(tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return
    outbox = tensor.clone()
    inbox = torch.empty(max(tensor.numel() - 1, 0), dtype=tensor.dtype)    # one short
    if rank % 2 == 0:
        dist.send(outbox, (rank + 1) % n)
        dist.recv(inbox, (rank - 1) % n)
    else:
        dist.recv(inbox, (rank - 1) % n)
        dist.send(outbox, (rank + 1) % n)
    tensor[:inbox.numel()].copy_(inbox)
