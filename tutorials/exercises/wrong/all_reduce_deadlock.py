"""Wrong (hangs): every rank sends with a blocking send before it receives, so every rank waits for a receiver."""
import torch
import torch.distributed as dist


def all_reduce(tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.tensor_split(n)
    for step in range(n - 1):
        send_i, recv_i = (rank - step - 1) % n, (rank - step - 2) % n
        got = torch.empty_like(chunks[recv_i])
        dist.send(chunks[send_i], right)          # waits until the right neighbour receives...
        dist.recv(got, left)                      # ...but it is itself stuck in its send
        chunks[recv_i].add_(got)
    for step in range(n - 1):
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n
        dist.send(chunks[send_i], right)
        dist.recv(chunks[recv_i], left)
