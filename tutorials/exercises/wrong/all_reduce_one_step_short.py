"""Wrong result: the reduce-scatter runs N-2 steps instead of N-1, so each chunk misses one rank's values."""
import torch
import torch.distributed as dist


def exchange(send, right, recv, left):
    requests = [dist.isend(send, right), dist.irecv(recv, left)]
    for r in requests:
        r.wait()


def all_reduce(tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.tensor_split(n)
    for step in range(n - 2):                          # off by one: should be range(n - 1)
        send_i, recv_i = (rank - step - 1) % n, (rank - step - 2) % n
        got = torch.empty_like(chunks[recv_i])
        exchange(chunks[send_i], right, got, left)
        chunks[recv_i].add_(got)
    for step in range(n - 1):
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n
        exchange(chunks[send_i], right, chunks[recv_i], left)
